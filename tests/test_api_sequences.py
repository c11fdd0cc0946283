"""Sequences over the REST API: drafts, immutable versions, status changes, listing, step kinds,
validation answered as problem details, and statistics.

Field paths in problem details are dotted, list indexes included: ``definition.steps.0.kind``.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import record_reply
from tests.helpers import rows

PROBLEM_JSON = "application/problem+json"
_phones = itertools.count()

# --- helpers (also used by tests/test_api_enrollments.py)


def assert_problem(
    response: Any, status: int, field: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``response`` is a problem-details body with ``status``, naming ``field`` and carrying ``code``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"] and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    if field is not None:
        fields = [error["field"] for error in body.get("errors", [])]
        assert field in fields, body
        assert all(error["message"] for error in body["errors"])
    if code is not None:
        assert body.get("code") == code, body
    return body


def message_step(text: str = "Hello", **fields: Any) -> dict[str, Any]:
    return {"kind": "message", "text": text, **fields}


def new_sequence(
    client: TestClient[Any], *steps: dict[str, Any], name: str = "welcome", **definition: Any
) -> str:
    """A draft sequence with ``steps`` (and other definition fields); returns its id."""
    body = {"name": name, "definition": {"steps": list(steps), **definition}}
    response = client.post("/v1/sequences", json=body)
    assert response.status_code == 201, response.text
    sequence_id: str = response.json()["id"]
    return sequence_id


def publish(client: TestClient[Any], sequence_id: str) -> dict[str, Any]:
    response = client.post(f"/v1/sequences/{sequence_id}/publish")
    assert response.status_code == 201, response.text
    version: dict[str, Any] = response.json()
    return version


def published(client: TestClient[Any], *steps: dict[str, Any], **definition: Any) -> str:
    """A published sequence with ``steps`` (one immediate message by default)."""
    sequence_id = new_sequence(client, *(steps or (message_step(),)), **definition)
    publish(client, sequence_id)
    return sequence_id


def new_contact(client: TestClient[Any], **fields: Any) -> str:
    phone = fields.pop("phone", f"+1415555{next(_phones) % 10_000:04d}")
    response = client.post("/v1/contacts", json={"phone": phone, **fields})
    assert response.status_code == 201, response.text
    contact_id: str = response.json()["id"]
    return contact_id


def enroll(client: TestClient[Any], sequence_id: str, contact_id: str, **fields: Any) -> dict[str, Any]:
    response = client.post(
        "/v1/enrollments", json={"sequence_id": sequence_id, "contact_id": contact_id, **fields}
    )
    assert response.status_code == 201, response.text
    enrollment: dict[str, Any] = response.json()
    return enrollment


def release(runtime: Runtime) -> int:
    """Run the release path once over everything due at the runtime's clock."""
    return release_batch(runtime.pool, runtime.clock, runtime.settings.followup)


def reply(pool: ConnectionPool, contact_id: str, at: datetime, body: str = "a reply") -> None:
    """An inbound message from the contact at ``at`` (as the messaging platform would record it)."""
    [(project_id,)] = rows(pool, "SELECT project_id FROM contacts WHERE id = %s", contact_id)
    record_reply(pool, project_id, uuid.UUID(contact_id), at, body)


def one(pool: ConnectionPool, sql: str, *params: Any) -> dict[str, Any] | None:
    with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql, params).fetchone()


def count(pool: ConnectionPool, sql: str, *params: Any) -> int:
    with pool.connection() as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    value: int = row[0]
    return value


def sequence_row(pool: ConnectionPool, sequence_id: str) -> dict[str, Any]:
    row = one(pool, "SELECT * FROM followup_sequences WHERE id = %s", sequence_id)
    assert row is not None
    return row


def version_count(pool: ConnectionPool, project: Project) -> int:
    return count(pool, "SELECT count(*) FROM followup_sequence_versions WHERE project_id = %s", project.id)


def sequence_count(pool: ConnectionPool, project: Project) -> int:
    return count(pool, "SELECT count(*) FROM followup_sequences WHERE project_id = %s", project.id)


# --- drafts


def test_create_stores_a_draft_with_the_default_policies(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    response = client.post(
        "/v1/sequences", json={"name": "  welcome  ", "definition": {"steps": [message_step("Hi")]}}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["name"] == "welcome"
    assert body["status"] == "draft"
    assert body["current_version_id"] is None and body["current_version"] is None
    assert body["draft"]["reentry"] == "after_finished"
    assert body["draft"]["stop_on"] == {
        "reply": True,
        "human_message": True,
        "opt_out": True,
        "lead_closed": True,
        "conversation_resolved": True,
    }
    step = body["draft"]["steps"][0]
    assert (step["kind"], step["text"], step["delay_seconds"], step["only_if"]) == ("message", "Hi", 0, [])

    row = sequence_row(pool, body["id"])
    assert row["project_id"] == project.id
    assert row["status"] == "draft"
    assert row["draft"] == body["draft"]
    assert version_count(pool, project) == 0
    assert client.get(f"/v1/sequences/{body['id']}").json() == body


def test_a_draft_may_be_incomplete_and_is_edited_with_patch(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    # Given a draft without steps
    created = client.post("/v1/sequences", json={"name": "draft"})
    assert created.status_code == 201, created.text
    sequence_id = created.json()["id"]
    assert created.json()["draft"]["steps"] == []

    # When its steps are set, then only its name changes
    steps = [message_step("one"), message_step("two {{vars.x}}", delay_seconds=60)]
    response = client.patch(
        f"/v1/sequences/{sequence_id}", json={"definition": {"steps": steps, "reentry": "never"}}
    )
    assert response.status_code == 200, response.text
    renamed = client.patch(f"/v1/sequences/{sequence_id}", json={"name": "renamed"})
    assert renamed.status_code == 200, renamed.text

    # Then the draft has the steps and the new name, and nothing was published
    body = renamed.json()
    assert body["name"] == "renamed"
    assert [s["text"] for s in body["draft"]["steps"]] == ["one", "two {{vars.x}}"]
    assert body["draft"]["steps"][1]["delay_seconds"] == 60
    assert body["draft"]["reentry"] == "never"
    assert body["status"] == "draft"
    row = sequence_row(pool, sequence_id)
    assert row["name"] == "renamed" and row["draft"] == body["draft"]
    assert version_count(pool, project) == 0


def test_every_step_kind_timing_and_option_round_trips_into_the_version(client: TestClient[Any]) -> None:
    steps = [
        message_step(
            'Hi {{contact.name | "there"}}',
            media_url="https://cdn.example.com/a.png",
            media_kind="image",
            only_if=["no_reply_since_enrollment"],
        ),
        {
            "kind": "ai",
            "instructions": "Ask whether {{vars.product}} arrived",
            "fallback": {"kind": "template", "text": "Did {{vars.product}} arrive?"},
            "delay_seconds": 86400,
            "only_if": ["no_reply_since_previous_step", "previous_not_read"],
        },
        {
            "kind": "message",
            "text": "See you at {{anchor.time}}",
            "anchor_offset_seconds": -7200,
            "grace_seconds": 600,
        },
        {"kind": "ai", "instructions": "Say goodbye", "fallback": {"kind": "skip"}},
    ]
    stop_on = {
        "reply": False,
        "human_message": True,
        "opt_out": True,
        "lead_closed": False,
        "conversation_resolved": True,
    }
    sequence_id = new_sequence(client, *steps, reentry="always", stop_on=stop_on)
    version = publish(client, sequence_id)

    definition = version["definition"]
    assert definition["reentry"] == "always"
    assert definition["stop_on"] == stop_on
    first, second, third, fourth = definition["steps"]
    assert first["kind"] == "message" and first["media_url"] == "https://cdn.example.com/a.png"
    assert first["media_kind"] == "image" and first["only_if"] == ["no_reply_since_enrollment"]
    assert second["kind"] == "ai" and second["delay_seconds"] == 86400
    assert second["fallback"] == {"kind": "template", "text": "Did {{vars.product}} arrive?"}
    assert second["only_if"] == ["no_reply_since_previous_step", "previous_not_read"]
    assert third["anchor_offset_seconds"] == -7200 and third["grace_seconds"] == 600
    assert fourth["fallback"] == {"kind": "skip"}


# --- versions


def test_publishing_freezes_versions_and_running_enrollments_keep_theirs(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    # Given a sequence published as version 1 and a contact enrolled in it
    sequence_id = new_sequence(
        client, message_step("v1 first"), message_step("v1 second", delay_seconds=3600)
    )
    first = publish(client, sequence_id)
    assert first["version"] == 1 and first["sequence_id"] == sequence_id
    sequence = client.get(f"/v1/sequences/{sequence_id}").json()
    assert sequence["status"] == "active"
    assert (sequence["current_version_id"], sequence["current_version"]) == (first["id"], 1)
    early = enroll(client, sequence_id, new_contact(client))
    assert early["version_id"] == first["id"]

    # When the draft is changed and published again
    patched = client.patch(
        f"/v1/sequences/{sequence_id}",
        json={
            "definition": {"steps": [message_step("v2 first"), message_step("v2 second", delay_seconds=60)]}
        },
    )
    assert patched.status_code == 200, patched.text
    second = publish(client, sequence_id)

    # Then version 2 is current, version 1 is unchanged, and the early enrollment still pins version 1
    assert second["version"] == 2 and second["id"] != first["id"]
    assert client.get(f"/v1/sequences/{sequence_id}").json()["current_version"] == 2
    versions = client.get(f"/v1/sequences/{sequence_id}/versions")
    assert versions.status_code == 200, versions.text
    items = versions.json()["items"]
    assert [v["version"] for v in items] == [2, 1]
    summary = {key: value for key, value in first.items() if key not in ("definition", "warnings")}
    assert items[1] == summary | {"step_count": 2}
    # a version read is the version published, without the publish answer's warnings
    assert client.get(f"/v1/sequences/{sequence_id}/versions/1").json() | {"warnings": []} == first
    stored = one(pool, "SELECT definition FROM followup_sequence_versions WHERE id = %s", first["id"])
    assert stored is not None and stored["definition"] == first["definition"]
    assert one(pool, "SELECT version_id FROM followup_enrollments WHERE id = %s", early["id"]) == {
        "version_id": uuid.UUID(first["id"])
    }
    late = enroll(client, sequence_id, new_contact(client))
    assert late["version_id"] == second["id"]

    # And releasing sends each enrollment the text of its own version
    release(runtime)
    clock.advance(timedelta(hours=1))
    release(runtime)
    bodies = {
        enrollment["id"]: [
            m["body"] for m in client.get(f"/v1/enrollments/{enrollment['id']}").json()["messages"]
        ]
        for enrollment in (early, late)
    }
    assert bodies == {early["id"]: ["v1 first", "v1 second"], late["id"]: ["v2 first", "v2 second"]}


def test_one_off_versions_are_not_listed_as_a_sequences_versions(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    sequence_id = published(client)
    response = client.post(
        "/v1/enrollments", json={"contact_id": new_contact(client), "steps": [message_step("just once")]}
    )
    assert response.status_code == 201, response.text
    assert response.json()["sequence_id"] is None
    row = one(
        pool,
        "SELECT sequence_id, version FROM followup_sequence_versions WHERE id = %s",
        response.json()["version_id"],
    )
    assert row == {"sequence_id": None, "version": 1}
    assert version_count(pool, project) == 2
    assert [v["version"] for v in client.get(f"/v1/sequences/{sequence_id}/versions").json()["items"]] == [1]


# --- status changes


def test_pause_and_resume_carry_the_enrollments_the_pause_paused(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime
) -> None:
    # Given a published sequence with an enrollment due now
    sequence_id = published(client, message_step("hi"))
    enrollment = enroll(client, sequence_id, new_contact(client))

    # When the sequence is paused and the enrollment comes up for release
    paused = client.post(f"/v1/sequences/{sequence_id}/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["status"] == "paused"
    release(runtime)

    # Then the enrollment is paused by the sequence and nothing was sent
    row = one(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment["id"])
    assert row == {"status": "paused", "reason": "sequence_paused"}
    assert (
        count(pool, "SELECT count(*) FROM messages WHERE followup_enrollment_id = %s", enrollment["id"]) == 0
    )
    assert_problem(client.post(f"/v1/sequences/{sequence_id}/pause"), 409, "sequence_id")

    # When it is resumed
    resumed = client.post(f"/v1/sequences/{sequence_id}/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"] == "active"

    # Then the enrollment is active again and its step is released
    row = one(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment["id"])
    assert row == {"status": "active", "reason": None}
    release(runtime)
    detail = client.get(f"/v1/enrollments/{enrollment['id']}").json()
    assert [m["body"] for m in detail["messages"]] == ["hi"]
    assert detail["enrollment"]["status"] == "completed"
    assert_problem(client.post(f"/v1/sequences/{sequence_id}/resume"), 409, "sequence_id")


def test_a_manually_paused_enrollment_stays_paused_when_the_sequence_resumes(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    sequence_id = published(client, message_step("hi", delay_seconds=60))
    enrollment = enroll(client, sequence_id, new_contact(client))
    assert client.post(f"/v1/enrollments/{enrollment['id']}/pause").status_code == 200
    client.post(f"/v1/sequences/{sequence_id}/pause")
    client.post(f"/v1/sequences/{sequence_id}/resume")
    row = one(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment["id"])
    assert row == {"status": "paused", "reason": "manual"}


def test_status_changes_that_do_not_apply_are_409_and_change_nothing(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    draft = new_sequence(client, message_step())
    assert_problem(client.post(f"/v1/sequences/{draft}/pause"), 409, "sequence_id")
    assert_problem(client.post(f"/v1/sequences/{draft}/resume"), 409, "sequence_id")
    assert sequence_row(pool, draft)["status"] == "draft"
    active = published(client)
    assert_problem(client.post(f"/v1/sequences/{active}/resume"), 409, "sequence_id")
    assert sequence_row(pool, active)["status"] == "active"


def test_archive_stops_new_enrollments_and_edits_while_running_ones_carry_on(
    client: TestClient[Any], pool: ConnectionPool, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    # Given an enrollment in a two-step sequence
    sequence_id = published(client, message_step("one"), message_step("two", delay_seconds=60))
    running = enroll(client, sequence_id, new_contact(client))
    release(runtime)

    # When the sequence is archived
    archived = client.post(f"/v1/sequences/{sequence_id}/archive")
    assert archived.status_code == 200, archived.text
    assert archived.json()["status"] == "archived"

    # Then it cannot be enrolled in, edited, published, paused or archived again
    contact = new_contact(client)
    enrollments_before = count(
        pool, "SELECT count(*) FROM followup_enrollments WHERE project_id = %s", project.id
    )
    response = client.post("/v1/enrollments", json={"sequence_id": sequence_id, "contact_id": contact})
    assert_problem(response, 409, "sequence_id", code="sequence_not_enrollable")
    assert_problem(client.patch(f"/v1/sequences/{sequence_id}", json={"name": "x"}), 409, "sequence_id")
    assert_problem(client.post(f"/v1/sequences/{sequence_id}/publish"), 409, "sequence_id")
    assert_problem(client.post(f"/v1/sequences/{sequence_id}/pause"), 409, "sequence_id")
    assert_problem(client.post(f"/v1/sequences/{sequence_id}/archive"), 409, "sequence_id")
    assert count(pool, "SELECT count(*) FROM followup_enrollments WHERE project_id = %s", project.id) == (
        enrollments_before
    )
    assert version_count(pool, project) == 1
    assert sequence_row(pool, sequence_id)["name"] == "welcome"

    # And the running enrollment still gets its second step
    clock.advance(timedelta(minutes=1))
    release(runtime)
    detail = client.get(f"/v1/enrollments/{running['id']}").json()
    assert [m["body"] for m in detail["messages"]] == ["one", "two"]
    assert detail["enrollment"]["status"] == "completed"


def test_archiving_a_paused_sequence_lets_the_enrollments_its_pause_paused_carry_on(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime
) -> None:
    # Given an enrollment paused by its sequence's pause
    sequence_id = published(client, message_step("hi"))
    enrollment = enroll(client, sequence_id, new_contact(client))
    client.post(f"/v1/sequences/{sequence_id}/pause")
    release(runtime)
    assert one(pool, "SELECT status FROM followup_enrollments WHERE id = %s", enrollment["id"]) == {
        "status": "paused"
    }

    # When the paused sequence is archived (which can never be resumed)
    assert client.post(f"/v1/sequences/{sequence_id}/archive").status_code == 200

    # Then the enrollment is not left live forever: it carries on like every other running one
    release(runtime)
    row = one(pool, "SELECT status FROM followup_enrollments WHERE id = %s", enrollment["id"])
    assert row == {"status": "completed"}


# --- listing


def test_list_paginates_and_filters_by_status(client: TestClient[Any], other_project: Project) -> None:
    # Given five sequences: two drafts, two active (one then archived), one paused
    drafts = {new_sequence(client, name=f"draft {i}") for i in range(2)}
    active = published(client)
    archived = published(client)
    client.post(f"/v1/sequences/{archived}/archive")
    paused = published(client)
    client.post(f"/v1/sequences/{paused}/pause")
    client.post("/v1/sequences", json={"name": "theirs"}, headers=other_project.headers)

    # When every page of two is read
    seen: list[str] = []
    after: str | None = None
    for _ in range(5):
        params: dict[str, Any] = {"limit": 2} | ({"after": after} if after else {})
        response = client.get("/v1/sequences", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        after = page["next"]
        if after is None:
            break

    # Then every sequence of the project shows up once, in id order
    assert seen == sorted(drafts | {active, archived, paused}, key=uuid.UUID)

    # And the status filter selects (and paginates) by status
    def ids(status: str, **params: Any) -> dict[str, Any]:
        response = client.get("/v1/sequences", params={"status": status, **params})
        assert response.status_code == 200, response.text
        page: dict[str, Any] = response.json()
        assert all(item["status"] == status for item in page["items"])
        return page

    assert {item["id"] for item in ids("draft")["items"]} == drafts
    assert [item["id"] for item in ids("active")["items"]] == [active]
    assert [item["id"] for item in ids("archived")["items"]] == [archived]
    assert [item["id"] for item in ids("paused")["items"]] == [paused]
    first = ids("draft", limit=1)
    assert first["next"] is not None
    rest = ids("draft", limit=1, after=first["next"])
    assert rest["next"] is None
    assert {first["items"][0]["id"], rest["items"][0]["id"]} == drafts


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"status": "deleted"}, 422, "status"),
        ({"limit": 0}, 422, "limit"),
        ({"limit": 501}, 422, "limit"),
        ({"limit": "ten"}, 400, "limit"),
        ({"after": "not-a-uuid"}, 400, "after"),
    ],
)
def test_bad_list_parameters_are_problems_naming_them(
    client: TestClient[Any], params: dict[str, Any], status: int, field: str
) -> None:
    assert_problem(client.get("/v1/sequences", params=params), status, field)


# --- another project's sequences


def test_another_projects_sequence_is_404_everywhere_and_untouched(
    client: TestClient[Any], pool: ConnectionPool, other_project: Project
) -> None:
    theirs = client.post(
        "/v1/sequences",
        json={"name": "Secret plan", "definition": {"steps": [message_step("secret text")]}},
        headers=other_project.headers,
    ).json()
    before = sequence_row(pool, theirs["id"])
    url = f"/v1/sequences/{theirs['id']}"
    for response in (
        client.get(url),
        client.patch(url, json={"name": "hijacked"}),
        client.post(f"{url}/publish"),
        client.post(f"{url}/pause"),
        client.post(f"{url}/resume"),
        client.post(f"{url}/archive"),
        client.get(f"{url}/versions"),
        client.get(f"{url}/statistics"),
    ):
        assert_problem(response, 404)
        assert "Secret" not in response.text and "secret text" not in response.text
    assert sequence_row(pool, theirs["id"]) == before
    assert version_count(pool, other_project) == 0
    assert_problem(client.get(f"/v1/sequences/{uuid.uuid4()}"), 404)


# --- validation at publish time


def test_publishing_without_steps_is_422_and_writes_no_version(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    sequence_id = new_sequence(client)
    body = assert_problem(client.post(f"/v1/sequences/{sequence_id}/publish"), 422, "definition.steps")
    assert "step" in body["detail"]
    assert version_count(pool, project) == 0
    row = sequence_row(pool, sequence_id)
    assert (row["status"], row["current_version_id"]) == ("draft", None)


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([message_step("Hi {{vars.}}")], "definition.steps.0.text"),
        ([message_step("ok"), message_step("Hi {{unknown.x}}")], "definition.steps.1.text"),
        ([message_step("ok"), message_step("ok"), message_step("Hi {{vars.name")], "definition.steps.2.text"),
        ([message_step("Hi {{ }}")], "definition.steps.0.text"),
        ([message_step("Hi {{anchor.year}}")], "definition.steps.0.text"),
        ([message_step("Hi {{{vars.x}}}")], "definition.steps.0.text"),
        ([message_step("stray }} here")], "definition.steps.0.text"),
        ([message_step("   ")], "definition.steps.0.text"),
        (
            [{"kind": "ai", "instructions": "x", "fallback": {"kind": "template", "text": "{{vars.a"}}],
            "definition.steps.0.fallback.text",
        ),
        (
            [{"kind": "ai", "instructions": "{{contact.email}}", "fallback": {"kind": "skip"}}],
            "definition.steps.0.instructions",
        ),
        (
            [message_step("ok", delay_seconds=60, anchor_offset_seconds=-60)],
            "definition.steps.0.anchor_offset_seconds",
        ),
        ([message_step("ok", only_if=["no_reply_since_previous_step"])], "definition.steps.0.only_if"),
        ([message_step("ok", only_if=["previous_not_read"])], "definition.steps.0.only_if"),
        ([message_step("ok", media_kind="image")], "definition.steps.0.media_url"),
        ([message_step("ok", media_url="https://cdn.example.com/a.png")], "definition.steps.0.media_kind"),
        (
            [message_step("ok", media_url="file:///etc/passwd", media_kind="image")],
            "definition.steps.0.media_url",
        ),
    ],
)
def test_publishing_a_bad_step_is_422_naming_the_step_and_field(
    client: TestClient[Any], pool: ConnectionPool, project: Project, steps: list[dict[str, Any]], field: str
) -> None:
    # Given a draft (drafts may be incomplete or wrong)
    sequence_id = new_sequence(client, *steps)
    # When it is published, then the problem names the step's field, and nothing is frozen
    assert_problem(client.post(f"/v1/sequences/{sequence_id}/publish"), 422, field)
    assert version_count(pool, project) == 0
    assert sequence_row(pool, sequence_id)["status"] == "draft"


def test_a_rejected_republish_keeps_the_current_version(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    sequence_id = published(client, message_step("good"))
    before = sequence_row(pool, sequence_id)
    client.patch(f"/v1/sequences/{sequence_id}", json={"definition": {"steps": [message_step("{{vars.}}")]}})
    assert_problem(client.post(f"/v1/sequences/{sequence_id}/publish"), 422, "definition.steps.0.text")
    assert version_count(pool, project) == 1
    assert sequence_row(pool, sequence_id)["current_version_id"] == before["current_version_id"]


# --- bad bodies: value errors are 422, shape errors 400, both naming the field


VALUE_ERRORS = [
    ({"steps": [{"kind": "sms", "text": "x"}]}, "definition.steps.0.kind"),
    ({"steps": [message_step("x"), {"kind": "wait", "delay_seconds": 5}]}, "definition.steps.1.kind"),
    ({"steps": [message_step("x", delay_seconds=-1)]}, "definition.steps.0.delay_seconds"),
    ({"steps": [message_step("x", delay_seconds=10**9)]}, "definition.steps.0.delay_seconds"),
    ({"steps": [message_step("x", grace_seconds=-5)]}, "definition.steps.0.grace_seconds"),
    (
        {"steps": [message_step("x", anchor_offset_seconds=-(10**9))]},
        "definition.steps.0.anchor_offset_seconds",
    ),
    ({"steps": [message_step("x", only_if=["sometimes"])]}, "definition.steps.0.only_if.0"),
    ({"steps": [message_step("x", media_kind="gif")]}, "definition.steps.0.media_kind"),
    (
        {"steps": [{"kind": "ai", "instructions": "x", "fallback": {"kind": "retry"}}]},
        "definition.steps.0.fallback.kind",
    ),
    ({"reentry": "sometimes"}, "definition.reentry"),
]

SHAPE_ERRORS = [
    ({"steps": [{"kind": "message"}]}, "definition.steps.0.text"),
    ({"steps": [{"text": "no kind"}]}, "definition.steps.0.kind"),
    ({"steps": [message_step("x", colour="red")]}, "definition.steps.0.colour"),
    ({"steps": [message_step("x", delay_seconds="soon")]}, "definition.steps.0.delay_seconds"),
    ({"steps": [{"kind": "message", "text": 5}]}, "definition.steps.0.text"),
    ({"steps": "one"}, "definition.steps"),
    ({"stop_on": {"reply": "yes"}}, "definition.stop_on.reply"),
    ({"stop_on": {"typing": True}}, "definition.stop_on.typing"),
]


@pytest.mark.parametrize(("definition", "field"), VALUE_ERRORS)
def test_creating_with_a_bad_value_is_422_and_creates_nothing(
    client: TestClient[Any], pool: ConnectionPool, project: Project, definition: dict[str, Any], field: str
) -> None:
    assert_problem(client.post("/v1/sequences", json={"name": "x", "definition": definition}), 422, field)
    assert sequence_count(pool, project) == 0


@pytest.mark.parametrize(("definition", "field"), SHAPE_ERRORS)
def test_creating_with_a_bad_shape_is_400_and_creates_nothing(
    client: TestClient[Any], pool: ConnectionPool, project: Project, definition: dict[str, Any], field: str
) -> None:
    assert_problem(client.post("/v1/sequences", json={"name": "x", "definition": definition}), 400, field)
    assert sequence_count(pool, project) == 0


@pytest.mark.parametrize(
    ("definition", "status", "field"),
    [(d, 422, f) for d, f in VALUE_ERRORS[:4]] + [(d, 400, f) for d, f in SHAPE_ERRORS[:3]],
)
def test_patching_with_a_bad_definition_leaves_the_draft_untouched(
    client: TestClient[Any], pool: ConnectionPool, definition: dict[str, Any], status: int, field: str
) -> None:
    sequence_id = new_sequence(client, message_step("keep me"))
    before = sequence_row(pool, sequence_id)
    response = client.patch(f"/v1/sequences/{sequence_id}", json={"name": "new", "definition": definition})
    assert_problem(response, status, field)
    assert sequence_row(pool, sequence_id) == before


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"name": ""}, 422, "name"),
        ({"name": "   "}, 422, "name"),
        ({"name": "x" * 201}, 422, "name"),
        ({"name": "a\x00b"}, 422, "name"),
        ({"name": "x", "definition": {"steps": [message_step("a\x00b")]}}, 422, "definition.steps.0.text"),
        (
            {
                "name": "x",
                "definition": {
                    "steps": [{"kind": "ai", "instructions": "\x00", "fallback": {"kind": "skip"}}]
                },
            },
            422,
            "definition.steps.0.instructions",
        ),
        ({}, 400, "name"),
        ({"name": 5}, 400, "name"),
        ({"name": "x", "status": "active"}, 400, "status"),
        ({"name": "x", "project_id": str(uuid.uuid4())}, 400, "project_id"),
    ],
)
def test_a_bad_create_body_is_a_problem_not_a_500(
    client: TestClient[Any],
    pool: ConnectionPool,
    project: Project,
    body: dict[str, Any],
    status: int,
    field: str,
) -> None:
    assert_problem(client.post("/v1/sequences", json=body), status, field)
    assert sequence_count(pool, project) == 0


def test_a_bad_patch_body_is_a_problem_and_changes_nothing(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    sequence_id = new_sequence(client, message_step("keep"))
    before = sequence_row(pool, sequence_id)
    url = f"/v1/sequences/{sequence_id}"
    assert_problem(client.patch(url, json={"name": ""}), 422, "name")
    assert_problem(client.patch(url, json={"name": "ok\x00"}), 422, "name")
    assert_problem(client.patch(url, json={"status": "active"}), 400, "status")
    assert_problem(client.patch(url, json={"definition": {"steps": [message_step("\x00")]}}), 422)
    assert sequence_row(pool, sequence_id) == before
    assert_problem(client.patch(f"/v1/sequences/{uuid.uuid4()}", json={"name": "x"}), 404)


def test_a_malformed_json_body_is_400(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    response = client.post(
        "/v1/sequences", content=b'{"name": "x",', headers={"content-type": "application/json"}
    )
    assert_problem(response, 400)
    assert sequence_count(pool, project) == 0
