"""Enrollments over the REST API: enroll() and its rejections (re-entry, dedupe, plan limit, opt-out,
unknown or foreign resources), one-off follow-ups, reading, listing, pause / resume / stop and reschedule.

Every rejection is checked to have written nothing (no enrollment, no version).
"""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from tests.conftest import Project
from tests.helpers import wait_until
from tests.test_api_sequences import (
    assert_problem,
    count,
    enroll,
    message_step,
    new_contact,
    new_sequence,
    one,
    published,
    release,
    reply,
    version_count,
)

# --- helpers


def enrollment_row(pool: ConnectionPool, enrollment_id: str) -> dict[str, Any]:
    row = one(pool, "SELECT * FROM followup_enrollments WHERE id = %s", enrollment_id)
    assert row is not None
    return row


def enrollment_count(pool: ConnectionPool, project: Project) -> int:
    return count(pool, "SELECT count(*) FROM followup_enrollments WHERE project_id = %s", project.id)


def post_enrollment(client: TestClient[Any], **body: Any) -> Any:
    return client.post("/v1/enrollments", json=body)


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def parse(value: str) -> datetime:
    return datetime.fromisoformat(value)


def stopped_events(pool: ConnectionPool, enrollment_id: str) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT data FROM outbox WHERE type = 'followup.stopped' AND aggregate_id = %s ORDER BY id",
            (enrollment_id,),
        ).fetchall()
    return [row[0] for row in rows]


# --- enroll


def test_enroll_pins_the_current_version_and_stores_everything_it_was_given(
    client: TestClient[Any], pool: ConnectionPool, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    # Given a sequence with its own stop flags, and a number of the project
    sequence_id = published(
        client,
        message_step("Hi {{vars.first_name}}", delay_seconds=600),
        stop_on={"reply": False, "lead_closed": False},
    )
    contact_id = new_contact(client)
    with pool.connection() as conn:
        inserted = conn.execute(
            "INSERT INTO numbers (project_id, phone, is_default) VALUES (%s, '+14155559999', true)"
            " RETURNING id",
            (project.id,),
        ).fetchone()
    assert inserted is not None
    number_id = str(inserted[0])
    anchor = clock.now() + timedelta(days=2)

    # When the contact is enrolled with variables, an anchor and a number preference
    response = post_enrollment(
        client,
        sequence_id=sequence_id,
        contact_id=contact_id,
        variables={"first_name": "Ada", "order": {"id": 42}},
        anchor_at=iso(anchor),
        number_id=number_id,
        dedupe_key="order-42",
    )

    # Then it is created, due after the first step's delay, with the sequence's stop flags copied
    assert response.status_code == 201, response.text
    body = response.json()
    current = client.get(f"/v1/sequences/{sequence_id}").json()["current_version_id"]
    assert body["version_id"] == current
    assert (body["sequence_id"], body["contact_id"], body["number_id"]) == (
        sequence_id,
        contact_id,
        number_id,
    )
    assert (body["status"], body["step_index"], body["source"], body["reason"]) == ("active", 0, "api", None)
    assert parse(body["next_run_at"]) == clock.now() + timedelta(seconds=600)
    assert parse(body["anchor_at"]) == anchor
    assert body["variables"] == {"first_name": "Ada", "order": {"id": 42}}
    assert body["dedupe_key"] == "order-42"

    row = enrollment_row(pool, body["id"])
    assert row["project_id"] == project.id
    assert row["version_id"] == uuid.UUID(current)
    assert row["number_id"] == uuid.UUID(number_id)
    assert row["anchor_at"] == anchor
    assert row["variables"] == {"first_name": "Ada", "order": {"id": 42}}
    assert row["enrolled_at"] == clock.now()
    flags = {k: row[f"stop_on_{k}"] for k in ("reply", "human_message", "opt_out", "lead_closed")}
    assert flags == {"reply": False, "human_message": True, "opt_out": True, "lead_closed": False}
    assert row["stop_on_conversation_resolved"] is True


def test_an_anchor_timed_first_step_is_due_relative_to_the_anchor(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = published(client, message_step("See you at {{anchor.time}}", anchor_offset_seconds=-7200))
    anchor = clock.now() + timedelta(days=1)
    body = enroll(client, sequence_id, new_contact(client), anchor_at=iso(anchor))
    assert parse(body["next_run_at"]) == anchor - timedelta(hours=2)


def test_get_returns_the_enrollment_with_its_step_runs_and_messages(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given an enrollment whose first step was released and second skipped for a missing variable
    sequence_id = published(
        client, message_step("Hi {{vars.name}}"), message_step("Code {{vars.code}}", delay_seconds=60)
    )
    enrollment = enroll(client, sequence_id, new_contact(client), variables={"name": "Ada"})
    release(runtime)
    clock.advance(timedelta(minutes=1))
    release(runtime)

    # When it is read
    response = client.get(f"/v1/enrollments/{enrollment['id']}")

    # Then it has its state, both step runs and the one message
    assert response.status_code == 200, response.text
    detail = response.json()
    assert set(detail) == {"enrollment", "step_runs", "messages"}
    assert detail["enrollment"]["id"] == enrollment["id"]
    assert detail["enrollment"]["status"] == "completed"
    runs = detail["step_runs"]
    assert [(r["step_index"], r["outcome"], r["reason"], r["reason_detail"]) for r in runs] == [
        (0, "queued", None, None),
        (1, "skipped", "missing_variable", "vars.code"),  # the code, and what it is about
    ]
    [message] = detail["messages"]
    assert (message["body"], message["step_index"], message["status"]) == ("Hi Ada", 0, "QUEUED")
    assert runs[0]["message_id"] == message["id"] and runs[1]["message_id"] is None


# --- one-off follow-ups


def test_a_one_off_follow_up_carries_its_own_steps_and_stop_flags(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    response = post_enrollment(
        client,
        contact_id=new_contact(client),
        steps=[message_step("Just once, {{vars.name}}", delay_seconds=30)],
        stop_on={"human_message": False},
        variables={"name": "Bo"},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["sequence_id"] is None
    version = one(pool, "SELECT * FROM followup_sequence_versions WHERE id = %s", body["version_id"])
    assert version is not None
    assert version["sequence_id"] is None and version["step_count"] == 1
    assert version["definition"]["steps"][0]["text"] == "Just once, {{vars.name}}"
    row = enrollment_row(pool, body["id"])
    assert (row["stop_on_human_message"], row["stop_on_reply"]) == (False, True)

    clock.advance(timedelta(seconds=30))
    release(runtime)
    messages = client.get(f"/v1/enrollments/{body['id']}").json()["messages"]
    assert [m["body"] for m in messages] == ["Just once, Bo"]


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([], "steps"),
        ([message_step("{{vars.}}")], "steps.0.text"),
        ([message_step("ok"), message_step("{{unknown.x}}")], "steps.1.text"),
        ([message_step("ok"), message_step("unclosed {{vars.a")], "steps.1.text"),
        ([message_step("ok", only_if=["previous_not_read"])], "steps.0.only_if"),
        ([message_step("a\x00b")], "steps.0.text"),
    ],
)
def test_a_bad_one_off_is_422_naming_the_step_and_writes_nothing(
    client: TestClient[Any], pool: ConnectionPool, project: Project, steps: list[dict[str, Any]], field: str
) -> None:
    response = post_enrollment(client, contact_id=new_contact(client), steps=steps)
    assert_problem(response, 422, field)
    assert enrollment_count(pool, project) == 0
    assert version_count(pool, project) == 0


@pytest.mark.parametrize(
    ("steps", "status", "field"),
    [
        ([{"kind": "sms", "text": "x"}], 422, "steps.0.kind"),
        ([message_step("x", delay_seconds=-1)], 422, "steps.0.delay_seconds"),
        ([{"kind": "message"}], 400, "steps.0.text"),
    ],
)
def test_a_one_off_that_does_not_decode_names_the_step(
    client: TestClient[Any],
    pool: ConnectionPool,
    project: Project,
    steps: list[dict[str, Any]],
    status: int,
    field: str,
) -> None:
    response = post_enrollment(client, contact_id=new_contact(client), steps=steps)
    assert_problem(response, status, field)
    assert enrollment_count(pool, project) == 0
    assert version_count(pool, project) == 0


def test_sequence_id_and_steps_are_exclusive_and_stop_on_goes_only_with_steps(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    sequence_id = published(client)
    contact_id = new_contact(client)
    versions = version_count(pool, project)
    for body, field in (
        ({"contact_id": contact_id}, "sequence_id"),
        ({"contact_id": contact_id, "sequence_id": sequence_id, "steps": [message_step()]}, "sequence_id"),
        ({"contact_id": contact_id, "sequence_id": sequence_id, "stop_on": {"reply": False}}, "stop_on"),
    ):
        assert_problem(client.post("/v1/enrollments", json=body), 422, field)
    assert enrollment_count(pool, project) == 0
    assert version_count(pool, project) == versions


# --- re-entry


def test_reentry_never_refuses_a_contact_enrolled_before_even_after_it_stopped(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    sequence_id = published(client, message_step("x", delay_seconds=60), reentry="never")
    contact_id = new_contact(client)
    first = enroll(client, sequence_id, contact_id)
    response = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id)
    assert_problem(response, 409, "contact_id", code="reentry_not_allowed")
    client.post(f"/v1/enrollments/{first['id']}/stop")
    response = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id)
    assert_problem(response, 409, "contact_id", code="reentry_not_allowed")
    assert enrollment_count(pool, project) == 1
    # another contact may still enter
    enroll(client, sequence_id, new_contact(client))


def test_reentry_after_finished_refuses_while_live_and_accepts_once_finished(
    client: TestClient[Any], pool: ConnectionPool, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    # Given a contact with a live enrollment in a one-step sequence (the default policy)
    sequence_id = published(client, message_step("x", delay_seconds=60))
    contact_id = new_contact(client)
    first = enroll(client, sequence_id, contact_id)

    # When enrolled again while it is live (active, then paused): rejected, nothing written
    response = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id)
    assert_problem(response, 409, "contact_id", code="already_enrolled")
    client.post(f"/v1/enrollments/{first['id']}/pause")
    response = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id)
    assert_problem(response, 409, "contact_id", code="already_enrolled")
    assert enrollment_count(pool, project) == 1

    # When the first is stopped: a second is accepted
    client.post(f"/v1/enrollments/{first['id']}/stop")
    second = enroll(client, sequence_id, contact_id)

    # When the second completes: a third is accepted
    clock.advance(timedelta(minutes=1))
    release(runtime)
    assert enrollment_row(pool, second["id"])["status"] == "completed"
    third = enroll(client, sequence_id, contact_id)
    assert len({first["id"], second["id"], third["id"]}) == 3
    assert enrollment_count(pool, project) == 3


def test_reentry_always_replaces_the_live_enrollment(
    client: TestClient[Any], pool: ConnectionPool, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    # Given a live enrollment in an "always" sequence
    sequence_id = published(client, message_step("x", delay_seconds=60), reentry="always")
    contact_id = new_contact(client)
    first = enroll(client, sequence_id, contact_id)
    clock.advance(timedelta(seconds=10))

    # When the contact is enrolled again
    second = enroll(client, sequence_id, contact_id)

    # Then the first is stopped as re-entered, with its event, and the second is the live one
    row = enrollment_row(pool, first["id"])
    assert (row["status"], row["reason"], row["finished_at"]) == ("stopped", "reentered", clock.now())
    assert enrollment_row(pool, second["id"])["status"] == "active"
    assert stopped_events(pool, first["id"]) == [
        {
            "enrollment_id": first["id"],
            "sequence_id": sequence_id,
            "contact_id": contact_id,
            "reason": "reentered",
        }
    ]
    live = client.get("/v1/enrollments", params={"contact_id": contact_id, "status": "active"}).json()
    assert [item["id"] for item in live["items"]] == [second["id"]]


def test_a_rejected_reentry_always_leaves_the_live_enrollment_running(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    # Given a live enrollment in an "always" sequence, and a plan that is now full
    sequence_id = published(client, message_step("x", delay_seconds=60), reentry="always")
    contact_id = new_contact(client)
    first = enroll(client, sequence_id, contact_id)
    with pool.connection() as conn:
        conn.execute("UPDATE projects SET max_active_enrollments = 0 WHERE id = %s", (project.id,))

    # When re-entry is rejected by the plan limit, then nothing was half-done: the first is still live
    response = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id)
    assert_problem(response, 409, code="plan_limit")
    assert enrollment_row(pool, first["id"])["status"] == "active"
    assert stopped_events(pool, first["id"]) == []
    assert enrollment_count(pool, project) == 1


# --- dedupe


def test_a_known_dedupe_key_returns_the_existing_enrollment_with_200(
    client: TestClient[Any], pool: ConnectionPool, project: Project, other_project: Project
) -> None:
    sequence_id = published(client, message_step("x", delay_seconds=60))
    contact_id = new_contact(client)
    first = enroll(client, sequence_id, contact_id, dedupe_key="signup-7")

    # the same request again: 200, the same enrollment, nothing new
    again = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id, dedupe_key="signup-7")
    assert again.status_code == 200, again.text
    assert again.json() == first
    # the key wins even over a request that would otherwise be rejected or differ
    other = post_enrollment(
        client, sequence_id=sequence_id, contact_id=new_contact(client), dedupe_key="signup-7"
    )
    assert other.status_code == 200, other.text
    assert other.json()["id"] == first["id"]
    assert enrollment_count(pool, project) == 1

    # another key is another enrollment (here rejected: the contact is already enrolled)
    response = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id, dedupe_key="signup-8")
    assert_problem(response, 409, code="already_enrolled")

    # keys are per project
    theirs_sequence = client.post(
        "/v1/sequences",
        json={"name": "t", "definition": {"steps": [message_step()]}},
        headers=other_project.headers,
    ).json()["id"]
    client.post(f"/v1/sequences/{theirs_sequence}/publish", headers=other_project.headers)
    theirs_contact = client.post(
        "/v1/contacts", json={"phone": "+14155550777"}, headers=other_project.headers
    ).json()["id"]
    theirs = client.post(
        "/v1/enrollments",
        json={"sequence_id": theirs_sequence, "contact_id": theirs_contact, "dedupe_key": "signup-7"},
        headers=other_project.headers,
    )
    assert theirs.status_code == 201, theirs.text
    assert theirs.json()["id"] != first["id"]


# --- plan limit, opt-out


def test_the_plan_limit_counts_live_enrollments(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    # Given a plan of two live enrollments, both used
    with pool.connection() as conn:
        conn.execute("UPDATE projects SET max_active_enrollments = 2 WHERE id = %s", (project.id,))
    sequence_id = published(client, message_step("x", delay_seconds=60))
    first = enroll(client, sequence_id, new_contact(client))
    second = enroll(client, sequence_id, new_contact(client))
    client.post(f"/v1/enrollments/{second['id']}/pause")

    # When a third contact is enrolled (into the sequence or a one-off): rejected, nothing written
    contact_id = new_contact(client)
    versions = version_count(pool, project)
    response = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id)
    assert_problem(response, 409, code="plan_limit")
    response = post_enrollment(client, contact_id=contact_id, steps=[message_step()])
    assert_problem(response, 409, code="plan_limit")
    assert enrollment_count(pool, project) == 2
    assert version_count(pool, project) == versions

    # When one finishes, a place is free again
    client.post(f"/v1/enrollments/{first['id']}/stop")
    enroll(client, sequence_id, contact_id)


def test_an_opted_out_contact_is_refused(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    sequence_id = published(client)
    contact_id = new_contact(client)
    with pool.connection() as conn:
        conn.execute("UPDATE contacts SET opted_out_at = now() WHERE id = %s", (contact_id,))
    response = post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id)
    body = assert_problem(response, 409, "contact_id", code="opted_out")
    assert "opted out" in body["detail"]
    response = post_enrollment(client, contact_id=contact_id, steps=[message_step()])
    assert_problem(response, 409, code="opted_out")
    assert enrollment_count(pool, project) == 0


# --- not enrollable, unknown, foreign


def test_a_draft_only_or_archived_sequence_is_not_enrollable(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    contact_id = new_contact(client)
    draft = new_sequence(client, message_step())
    response = post_enrollment(client, sequence_id=draft, contact_id=contact_id)
    assert_problem(response, 409, "sequence_id", code="sequence_not_enrollable")
    archived = published(client)
    client.post(f"/v1/sequences/{archived}/archive")
    response = post_enrollment(client, sequence_id=archived, contact_id=contact_id)
    assert_problem(response, 409, "sequence_id", code="sequence_not_enrollable")
    assert enrollment_count(pool, project) == 0


def test_a_paused_sequence_still_takes_enrollments(client: TestClient[Any]) -> None:
    sequence_id = published(client)
    client.post(f"/v1/sequences/{sequence_id}/pause")
    assert enroll(client, sequence_id, new_contact(client))["status"] == "active"


def test_unknown_or_foreign_resources_are_404_and_write_nothing(
    client: TestClient[Any], pool: ConnectionPool, project: Project, other_project: Project
) -> None:
    # Given a sequence, contact and number of another project
    theirs_sequence = client.post(
        "/v1/sequences",
        json={"name": "t", "definition": {"steps": [message_step()]}},
        headers=other_project.headers,
    ).json()["id"]
    client.post(f"/v1/sequences/{theirs_sequence}/publish", headers=other_project.headers)
    theirs_contact = client.post(
        "/v1/contacts", json={"phone": "+14155550778"}, headers=other_project.headers
    ).json()["id"]
    with pool.connection() as conn:
        row = conn.execute(
            "INSERT INTO numbers (project_id, phone) VALUES (%s, '+14155558888') RETURNING id",
            (other_project.id,),
        ).fetchone()
    assert row is not None
    theirs_number = str(row[0])
    mine_sequence, mine_contact = published(client), new_contact(client)

    # When any of them (or an unknown id) is used, then 404 naming the field
    for body, field in (
        ({"sequence_id": theirs_sequence, "contact_id": mine_contact}, "sequence_id"),
        ({"sequence_id": str(uuid.uuid4()), "contact_id": mine_contact}, "sequence_id"),
        ({"sequence_id": mine_sequence, "contact_id": theirs_contact}, "contact_id"),
        ({"sequence_id": mine_sequence, "contact_id": str(uuid.uuid4())}, "contact_id"),
        ({"sequence_id": mine_sequence, "contact_id": mine_contact, "number_id": theirs_number}, "number_id"),
        (
            {"sequence_id": mine_sequence, "contact_id": mine_contact, "number_id": str(uuid.uuid4())},
            "number_id",
        ),
        (
            {"sequence_id": mine_sequence, "contact_id": mine_contact, "conversation_id": str(uuid.uuid4())},
            "conversation_id",
        ),
        ({"contact_id": theirs_contact, "steps": [message_step()]}, "contact_id"),
    ):
        assert_problem(client.post("/v1/enrollments", json=body), 404, field)

    # And nothing was written in either project
    assert enrollment_count(pool, project) == 0
    assert enrollment_count(pool, other_project) == 0
    assert version_count(pool, project) == 1


@pytest.mark.parametrize(
    ("extra", "status", "field"),
    [
        ({"anchor_at": "2030-01-02T10:00:00"}, 422, "anchor_at"),
        ({"anchor_at": "tomorrow"}, 400, "anchor_at"),
        ({"dedupe_key": ""}, 422, "dedupe_key"),
        ({"dedupe_key": "k" * 201}, 422, "dedupe_key"),
        ({"dedupe_key": "a\x00b"}, 422, "dedupe_key"),
        ({"variables": {"name": "a\x00b"}}, 422, "variables.name"),
        ({"variables": {"deep": ["ok", {"x": "\x00"}]}}, 422, "variables.deep.1.x"),
        ({"variables": ["not", "an", "object"]}, 400, "variables"),
        ({"colour": "red"}, 400, "colour"),
        ({"status": "paused"}, 400, "status"),
        ({"contact_id": "not-a-uuid"}, 400, "contact_id"),
    ],
)
def test_bad_enroll_bodies_are_problems_and_write_nothing(
    client: TestClient[Any],
    pool: ConnectionPool,
    project: Project,
    extra: dict[str, Any],
    status: int,
    field: str,
) -> None:
    body = {"sequence_id": published(client), "contact_id": new_contact(client), **extra}
    assert_problem(client.post("/v1/enrollments", json=body), status, field)
    assert enrollment_count(pool, project) == 0


# --- list


def test_list_filters_by_sequence_contact_and_status_and_paginates_newest_first(
    client: TestClient[Any], other_project: Project, clock: ManualClock
) -> None:
    # Given six enrollments over two sequences and three contacts, a second apart, one paused and one
    # stopped
    first, second = published(client, message_step("x", delay_seconds=60)), published(client)
    a, b, c = new_contact(client), new_contact(client), new_contact(client)
    enrollments: dict[tuple[str, str], str] = {}
    for s in (first, second):
        for k in (a, b, c):
            enrollments[s, k] = enroll(client, s, k)["id"]
            clock.advance(timedelta(seconds=1))
    client.post(f"/v1/enrollments/{enrollments[first, b]}/pause")
    client.post(f"/v1/enrollments/{enrollments[second, c]}/stop")

    def ids(**params: Any) -> list[str]:
        """Every id over all pages of two."""
        seen: list[str] = []
        after = None
        for _ in range(10):
            query = {"limit": 2, **params} | ({"after": after} if after else {})
            response = client.get("/v1/enrollments", params=query)
            assert response.status_code == 200, response.text
            page = response.json()
            assert len(page["items"]) <= 2
            seen += [item["id"] for item in page["items"]]
            after = page["next"]
            if after is None:
                return seen
        raise AssertionError("too many pages")

    def expected(*keys: tuple[str, str]) -> list[str]:
        """The enrollments of ``keys``, newest first."""
        return [enrollments[key] for key in reversed(enrollments) if key in keys]

    everything = ids()
    assert everything == list(reversed(enrollments.values()))
    assert ids(sequence_id=first) == expected((first, a), (first, b), (first, c))
    assert ids(contact_id=a) == expected((first, a), (second, a))
    assert ids(status="paused") == expected((first, b))
    assert ids(status="stopped") == expected((second, c))
    assert ids(sequence_id=second, status="active") == expected((second, a), (second, b))
    assert ids(sequence_id=first, contact_id=c) == expected((first, c))
    assert ids(status="completed") == []
    # another project sees none of them
    theirs = client.get("/v1/enrollments", headers=other_project.headers).json()
    assert theirs == {"items": [], "next": None}


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"status": "running"}, 422, "status"),
        ({"limit": 0}, 422, "limit"),
        ({"sequence_id": "nope"}, 400, "sequence_id"),
        ({"contact_id": "nope"}, 400, "contact_id"),
        ({"after": "nope"}, 400, "after"),
    ],
)
def test_bad_list_parameters_are_problems_naming_them(
    client: TestClient[Any], params: dict[str, Any], status: int, field: str
) -> None:
    assert_problem(client.get("/v1/enrollments", params=params), status, field)


# --- pause, resume, stop


def test_pause_resume_and_stop_by_hand(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    # Given an enrollment due in a minute
    sequence_id = published(client, message_step("x", delay_seconds=60))
    enrollment = enroll(client, sequence_id, new_contact(client))
    url = f"/v1/enrollments/{enrollment['id']}"

    # When paused: paused by hand, and not released when due
    paused = client.post(f"{url}/pause")
    assert paused.status_code == 200, paused.text
    assert (paused.json()["status"], paused.json()["reason"]) == ("paused", "manual")
    assert_problem(client.post(f"{url}/pause"), 409, "enrollment_id")
    clock.advance(timedelta(hours=1))
    assert release(runtime) == 0

    # When resumed after its step fell due: active, due now
    resumed = client.post(f"{url}/resume")
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["status"], resumed.json()["reason"]) == ("active", None)
    assert parse(resumed.json()["next_run_at"]) == clock.now()
    assert_problem(client.post(f"{url}/resume"), 409, "enrollment_id")

    # When stopped with a note: stopped by hand, with its event, and finished for good
    stopped = client.post(f"{url}/stop", json={"note": "customer called"})
    assert stopped.status_code == 200, stopped.text
    body = stopped.json()
    assert (body["status"], body["reason"], body["note"]) == ("stopped", "manual", "customer called")
    assert parse(body["finished_at"]) == clock.now()
    row = enrollment_row(pool, enrollment["id"])
    assert (row["status"], row["reason"], row["note"]) == ("stopped", "manual", "customer called")
    assert stopped_events(pool, enrollment["id"]) == [
        {
            "enrollment_id": enrollment["id"],
            "sequence_id": sequence_id,
            "contact_id": enrollment["contact_id"],
            "reason": "manual",
        }
    ]
    for action in ("pause", "resume", "stop"):
        assert_problem(client.post(f"{url}/{action}"), 409, "enrollment_id")
    assert release(runtime) == 0
    assert enrollment_row(pool, enrollment["id"]) == row


def test_a_resumed_enrollment_keeps_a_due_time_still_ahead(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = published(client, message_step("x", delay_seconds=3600))
    enrollment = enroll(client, sequence_id, new_contact(client))
    client.post(f"/v1/enrollments/{enrollment['id']}/pause")
    clock.advance(timedelta(minutes=10))
    resumed = client.post(f"/v1/enrollments/{enrollment['id']}/resume").json()
    assert resumed["next_run_at"] == enrollment["next_run_at"]


def test_stop_works_without_a_body_and_rejects_a_bad_note(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    sequence_id = published(client, message_step("x", delay_seconds=60))
    enrollment = enroll(client, sequence_id, new_contact(client))
    url = f"/v1/enrollments/{enrollment['id']}/stop"
    assert_problem(client.post(url, json={"note": "n" * 501}), 422, "note")
    assert_problem(client.post(url, json={"note": "a\x00b"}), 422, "note")
    assert_problem(client.post(url, json={"reason": "other"}), 400, "reason")
    assert enrollment_row(pool, enrollment["id"])["status"] == "active"
    response = client.post(url)
    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["note"]) == ("stopped", None)


# --- PATCH: variables and reschedule


def test_patch_moves_an_anchor_timed_pending_step_with_the_anchor(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    # Given an enrollment whose pending step is a reminder two hours before the anchor
    sequence_id = published(
        client, message_step("Reminder: {{anchor.time}} {{vars.place}}", anchor_offset_seconds=-7200)
    )
    anchor = clock.now() + timedelta(days=1)
    enrollment = enroll(
        client, sequence_id, new_contact(client), anchor_at=iso(anchor), variables={"place": "A"}
    )

    # When the appointment moves a day later and the variables change
    later = anchor + timedelta(days=1)
    response = client.patch(
        f"/v1/enrollments/{enrollment['id']}", json={"anchor_at": iso(later), "variables": {"place": "B"}}
    )

    # Then the step is due two hours before the new anchor, and the variables are replaced
    assert response.status_code == 200, response.text
    body = response.json()
    assert parse(body["anchor_at"]) == later
    assert parse(body["next_run_at"]) == later - timedelta(hours=2)
    assert body["variables"] == {"place": "B"}
    row = enrollment_row(pool, enrollment["id"])
    assert (row["anchor_at"], row["next_run_at"]) == (later, later - timedelta(hours=2))

    # And nothing goes out at the old time; the reminder goes out at the new one, with the new values
    clock.set(anchor - timedelta(hours=2))
    assert release(runtime) == 0
    clock.set(later - timedelta(hours=2))
    release(runtime)
    messages = client.get(f"/v1/enrollments/{enrollment['id']}").json()["messages"]
    assert [m["body"] for m in messages] == [f"Reminder: {later.strftime('%H:%M')} B"]


def test_patch_keeps_a_delay_timed_step_where_it_is(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = published(client, message_step("x", delay_seconds=3600))
    enrollment = enroll(client, sequence_id, new_contact(client), variables={"a": 1})
    new_anchor = clock.now() + timedelta(days=3)
    response = client.patch(f"/v1/enrollments/{enrollment['id']}", json={"anchor_at": iso(new_anchor)})
    assert response.status_code == 200, response.text
    assert response.json()["next_run_at"] == enrollment["next_run_at"]
    assert response.json()["variables"] == {"a": 1}  # absent: kept
    only_vars = client.patch(f"/v1/enrollments/{enrollment['id']}", json={"variables": {"b": 2}}).json()
    assert parse(only_vars["anchor_at"]) == new_anchor  # absent: kept
    assert only_vars["variables"] == {"b": 2}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"anchor_at": "2030-01-05T10:00:00"}, 422, "anchor_at"),
        ({"anchor_at": "next week"}, 400, "anchor_at"),
        ({"variables": {"k": "\x00"}}, 422, "variables.k"),
        ({"variables": None}, 400, "variables"),
        ({"status": "active"}, 400, "status"),
    ],
)
def test_a_bad_patch_changes_nothing(
    client: TestClient[Any], pool: ConnectionPool, body: dict[str, Any], status: int, field: str
) -> None:
    sequence_id = published(client, message_step("x", anchor_offset_seconds=-60))
    enrollment = enroll(
        client, sequence_id, new_contact(client), anchor_at="2030-01-03T10:00:00Z", variables={"a": 1}
    )
    before = enrollment_row(pool, enrollment["id"])
    assert_problem(client.patch(f"/v1/enrollments/{enrollment['id']}", json=body), status, field)
    assert enrollment_row(pool, enrollment["id"]) == before


def test_a_finished_enrollment_cannot_be_patched(client: TestClient[Any], pool: ConnectionPool) -> None:
    sequence_id = published(client, message_step("x", delay_seconds=60))
    enrollment = enroll(client, sequence_id, new_contact(client))
    client.post(f"/v1/enrollments/{enrollment['id']}/stop")
    before = enrollment_row(pool, enrollment["id"])
    response = client.patch(f"/v1/enrollments/{enrollment['id']}", json={"variables": {"x": 1}})
    assert_problem(response, 409, "enrollment_id")
    assert enrollment_row(pool, enrollment["id"]) == before


def test_a_reschedule_racing_a_release_does_not_move_the_step_the_release_advanced_to(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock
) -> None:
    # Given an enrollment: a reminder an hour before the anchor, then a message a day later
    sequence_id = published(
        client,
        message_step("reminder", anchor_offset_seconds=-3600),
        message_step("later", delay_seconds=86400),
    )
    anchor = clock.now() + timedelta(days=1)
    enrollment = enroll(client, sequence_id, new_contact(client), anchor_at=iso(anchor))
    second_due = clock.now() + timedelta(days=2)
    responses: list[Any] = []

    # When a release holds the enrollment and advances it to the second step,
    # while a PATCH moving the anchor comes in and has to wait for it
    with pool.connection() as release_tx:
        release_tx.execute("SELECT 1 FROM followup_enrollments WHERE id = %s FOR UPDATE", (enrollment["id"],))
        release_tx.execute(
            "UPDATE followup_enrollments SET step_index = 1, next_run_at = %s WHERE id = %s",
            (second_due, enrollment["id"]),
        )
        patch = threading.Thread(
            target=lambda: responses.append(
                client.patch(
                    f"/v1/enrollments/{enrollment['id']}",
                    json={"anchor_at": iso(anchor + timedelta(hours=5))},
                )
            )
        )

        def patch_waits_or_answered() -> bool:
            waiting = count(
                pool,
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            return bool(waiting) or not patch.is_alive()

        patch.start()
        # hold the lock until the PATCH waits for it (or has answered already: then it did not wait)
        wait_until(patch_waits_or_answered, timeout=30, what="the PATCH waiting for the release's lock")
    patch.join(30)

    # Then the PATCH applied to the step the release moved to (delay-timed: its due time stays)
    [response] = responses
    assert response.status_code == 200, response.text
    row = enrollment_row(pool, enrollment["id"])
    assert (row["step_index"], row["next_run_at"]) == (1, second_due)
    assert row["anchor_at"] == anchor + timedelta(hours=5)


# --- another project's enrollments


def test_another_projects_enrollment_is_404_everywhere_and_untouched(
    client: TestClient[Any], pool: ConnectionPool, other_project: Project
) -> None:
    headers = other_project.headers
    sequence_id = client.post(
        "/v1/sequences",
        json={"name": "t", "definition": {"steps": [message_step("x", delay_seconds=60)]}},
        headers=headers,
    ).json()["id"]
    client.post(f"/v1/sequences/{sequence_id}/publish", headers=headers)
    contact_id = client.post("/v1/contacts", json={"phone": "+14155550779"}, headers=headers).json()["id"]
    theirs = client.post(
        "/v1/enrollments",
        json={"sequence_id": sequence_id, "contact_id": contact_id, "variables": {"secret": "s3cr3t"}},
        headers=headers,
    ).json()
    before = enrollment_row(pool, theirs["id"])
    url = f"/v1/enrollments/{theirs['id']}"
    for response in (
        client.get(url),
        client.patch(url, json={"variables": {}}),
        client.post(f"{url}/pause"),
        client.post(f"{url}/resume"),
        client.post(f"{url}/stop", json={"note": "x"}),
    ):
        assert_problem(response, 404, "enrollment_id")
        assert "s3cr3t" not in response.text
    assert enrollment_row(pool, theirs["id"]) == before
    assert client.get("/v1/enrollments", params={"contact_id": contact_id}).json()["items"] == []
    assert_problem(client.get(f"/v1/enrollments/{uuid.uuid4()}"), 404)


def test_a_not_found_problem_has_no_code_but_a_rejection_has_one(client: TestClient[Any]) -> None:
    body = assert_problem(client.get(f"/v1/enrollments/{uuid.uuid4()}"), 404)
    assert "code" not in body
    sequence_id = published(client, message_step("x", delay_seconds=60))
    contact_id = new_contact(client)
    enroll(client, sequence_id, contact_id)
    body = assert_problem(post_enrollment(client, sequence_id=sequence_id, contact_id=contact_id), 409)
    assert body["code"] == "already_enrolled"


def test_a_reply_stops_the_enrollment_at_release_and_is_visible_in_its_detail(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    # Given a two-step enrollment whose first step went out
    sequence_id = published(client, message_step("one"), message_step("two", delay_seconds=60))
    contact_id = new_contact(client)
    enrollment = enroll(client, sequence_id, contact_id)
    release(runtime)
    # When the contact replies before the second step
    reply(pool, contact_id, clock.now() + timedelta(seconds=5))
    clock.advance(timedelta(minutes=1))
    release(runtime)
    # Then the enrollment stopped as replied and only the first message exists
    detail = client.get(f"/v1/enrollments/{enrollment['id']}").json()
    assert (detail["enrollment"]["status"], detail["enrollment"]["reason"]) == ("stopped", "replied")
    assert [m["body"] for m in detail["messages"]] == ["one"]
    # and the contact may enter again (after_finished)
    enroll(client, sequence_id, contact_id)
