"""A sequence's time-travel preview (``POST /v1/sequences/{id}/preview``): the schedule a contact would get
under the current settings, each step's time, deferrals, text or skip reason, without acting; the same
contact then enrolled for real and released on the controllable clock gets exactly that schedule.

Sequences, contacts and settings are made through the API; time is the ManualClock; the real path is the
release service's ``release_one``.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from litestar.testing import TestClient

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.core.settings import FollowupSettings
from libs.common.followups.preview import PreviewRequest, preview
from services.release.release import release_one
from tests.conftest import Project
from tests.delayed_rule_helpers import assert_problem
from tests.factories import make_contact, make_sequence
from tests.helpers import rows
from tests.release_helpers import sample

PREVIEWS = "whatstig_followup_previews_total"

SETTINGS = FollowupSettings()
#: Friday 2030-01-11, 21:30 UTC: 16:30 in New York, half an hour before its send window closes.
FRIDAY_EVENING = datetime(2030, 1, 11, 21, 30, tzinfo=UTC)
NINE_TO_FIVE = {"start": "09:00", "end": "17:00", "days": ["mon", "tue", "wed", "thu", "fri"]}
#: The tables a preview writes in its savepoint, and must leave as they were.
TABLES = (
    "followup_enrollments",
    "followup_step_runs",
    "messages",
    "message_status_events",
    "outbox",
    "activities",
    "followup_instance_pacing",
)


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def new_contact(client: TestClient[Any], **fields: Any) -> str:
    phone = fields.pop("phone", f"+1555{uuid.uuid4().int % 10**7:07d}")
    return ok(client.post("/v1/contacts", json={"phone": phone, **fields}), 201)["id"]  # type: ignore[no-any-return]


def new_sequence(
    client: TestClient[Any], *steps: dict[str, Any], publish: bool = True, **definition: Any
) -> str:
    body = {"name": "s", "definition": {"steps": list(steps), **definition}}
    created = ok(client.post("/v1/sequences", json=body), 201)
    if publish:
        ok(client.post(f"/v1/sequences/{created['id']}/publish"), 201)
    return created["id"]  # type: ignore[no-any-return]


def previewed(client: TestClient[Any], sequence_id: str, **body: Any) -> dict[str, Any]:
    return ok(client.post(f"/v1/sequences/{sequence_id}/preview", json=body))  # type: ignore[no-any-return]


def table_counts(runtime: Runtime) -> dict[str, int]:
    return {table: rows(runtime.pool, f"SELECT count(*) FROM {table}")[0][0] for table in TABLES}


def predicted(answer: dict[str, Any]) -> list[tuple[int, str, str | None, datetime]]:
    """The preview as the releases it predicts: (step, action, stored reason, when), deferrals included."""
    actions = {"queued": "queue", "skipped": "skip", "paused": "pause", "stopped": "stop"}
    out: list[tuple[int, str, str | None, datetime]] = []
    for step in answer["steps"]:
        for deferral in step["deferrals"]:
            out.append((step["step_index"], "defer", deferral["reason"], _time(deferral["at"])))
        if step["outcome"] in actions:
            reason = step["reason"]
            if step["reason_detail"] is not None:
                reason = f"{reason}:{step['reason_detail']}"
            out.append((step["step_index"], actions[step["outcome"]], reason, _time(step["at"])))
    return out


def released_for_real(runtime: Runtime, enrollment_id: str) -> list[tuple[int, str, str | None, datetime]]:
    """Release the enrollment on the controllable clock at each of its due times until it is no longer
    active: (step, action, reason, when) of each release."""
    clock = manual(runtime)
    out: list[tuple[int, str, str | None, datetime]] = []
    while True:
        found = rows(
            runtime.pool,
            "SELECT step_index, next_run_at FROM followup_enrollments WHERE id = %s AND status = 'active'",
            enrollment_id,
        )
        if not found:
            return out
        step_index, due = found[0]
        clock.set(max(due, clock.now()))
        released = release_one(runtime.pool, clock, SETTINGS)
        assert released is not None and str(released.enrollment_id) == enrollment_id
        out.append((step_index, released.action, released.reason, clock.now()))
        assert len(out) < 50, out


def manual(runtime: Runtime) -> ManualClock:
    clock = runtime.clock
    assert isinstance(clock, ManualClock)
    return clock


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- what it predicts is what happens -----------------------------------------------------------------------


def test_the_preview_predicts_what_the_release_path_then_does_for_the_same_contact(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given a project with a send window (09:00-17:00 weekdays, in the contact's zone) and a cap of one
    # follow-up a day, and a sequence whose steps meet the window, the cap, a missing variable and an AI
    # step without a model configured
    manual(runtime).set(FRIDAY_EVENING)
    ok(client.put("/v1/settings", json={"send_window": NINE_TO_FIVE, "max_per_contact_24h": 1}))
    contact = new_contact(client, name="Ada", timezone="America/New_York")
    sequence = new_sequence(
        client,
        {"kind": "message", "text": "Hi {{contact.name}}"},
        {"kind": "message", "text": "Still there, {{vars.first}}?", "delay_seconds": 3600},
        {"kind": "message", "text": "Your code: {{vars.code}}", "delay_seconds": 60},
        {
            "kind": "ai",
            "instructions": "Ask how it went",
            "fallback": {"kind": "template", "text": "How did it go, {{contact.name}}?"},
            "delay_seconds": 3600,
        },
    )
    before, counted = table_counts(runtime), sample(PREVIEWS, result="complete")

    # When the contact's schedule is previewed
    answer = previewed(client, sequence, contact_id=contact, variables={"first": "Ada"})

    # Then it says what each step would do, when, in the contact's zone, and nothing was kept
    assert table_counts(runtime) == before
    assert sample(PREVIEWS, result="complete") == counted + 1
    assert (answer["rejected"], answer["complete"], answer["timezone"]) == (None, True, "America/New_York")
    assert answer["version"] == 1
    steps = answer["steps"]
    assert [s["outcome"] for s in steps] == ["queued", "queued", "skipped", "queued"]
    assert (steps[0]["at"], steps[0]["local_at"]) == ("2030-01-11T21:30:00Z", "2030-01-11T16:30:00-05:00")
    assert steps[0]["text"] == "Hi Ada"
    # an hour later the window has closed: Monday 09:00 in New York
    assert steps[1]["due_at"] == steps[1]["at"] == "2030-01-14T14:00:00Z"
    assert steps[1]["text"] == "Still there, Ada?"
    # a minute later the cap holds it a day, then its variable is missing
    assert [(d["reason"], d["until"]) for d in steps[2]["deferrals"]] == [
        ("contact_cap", "2030-01-15T14:00:00Z")
    ]
    assert (steps[2]["reason"], steps[2]["reason_detail"], steps[2]["text"]) == (
        "missing_variable",
        "vars.code",
        None,
    )
    assert (steps[3]["kind"], steps[3]["reason"], steps[3]["reason_detail"]) == (
        "ai",
        "ai_fallback",
        "model_unavailable",
    )
    assert (steps[3]["text"], steps[3]["written_by_model"]) == ("How did it go, Ada?", False)

    # When the same contact is enrolled for real and released on the clock
    enrollment = ok(
        client.post(
            "/v1/enrollments",
            json={"sequence_id": sequence, "contact_id": contact, "variables": {"first": "Ada"}},
        ),
        201,
    )["id"]
    real = released_for_real(runtime, enrollment)

    # Then every release happens as the preview said: the same steps, actions, reasons and times
    assert real == predicted(answer)
    bodies = rows(
        runtime.pool,
        "SELECT followup_step_index, body FROM messages WHERE followup_enrollment_id = %s ORDER BY 1",
        enrollment,
    )
    assert bodies == [(s["step_index"], s["text"]) for s in steps if s["outcome"] == "queued"]


def test_pacing_and_the_service_window_are_predicted_as_the_release_path_applies_them(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given a number paced at one follow-up a minute, the service window enforced, a contact who never wrote,
    # and steps due at once: three with an approved template, one without
    ok(client.put("/v1/settings", json={"send_delay_ms": 60_000, "service_window": "enforced"}))
    ok(client.post("/v1/numbers", json={"phone": "+15550000301"}), 201)
    contact = new_contact(client, name="Ada")
    template = {"name": "check_in", "language": "en", "parameters": ["{{contact.name}}"]}
    sequence = new_sequence(
        client,
        {"kind": "message", "text": "Hi {{contact.name}}", "whatsapp_template": template},
        {"kind": "message", "text": "Still there?", "whatsapp_template": template},
        {
            "kind": "message",
            "text": "Read it?",
            "whatsapp_template": template,
            "only_if": ["previous_not_read"],
        },
        {"kind": "message", "text": "Free-form"},
    )
    start = manual(runtime).now()

    answer = previewed(client, sequence, contact_id=contact)

    steps = answer["steps"]
    assert [(s["outcome"], s["reason"]) for s in steps] == [
        ("queued", "service_window_template"),
        ("queued", "service_window_template"),
        ("queued", "service_window_template"),
        ("skipped", "outside_service_window"),
    ]
    assert steps[0]["template"] == {"name": "check_in", "language": "en", "parameters": ["Ada"]}
    assert [[d["reason"] for d in s["deferrals"]] for s in steps] == [[], ["pacing"], ["pacing"], []]
    assert [_time(s["at"]) - start for s in steps[:3]] == [timedelta(minutes=m) for m in range(3)]
    assert table_counts(runtime)["followup_instance_pacing"] == 0  # the number's pacing row went too

    # the same contact released for real on the clock meets the same pacing, at the same times
    enrollment = ok(
        client.post("/v1/enrollments", json={"sequence_id": sequence, "contact_id": contact}), 201
    )
    assert released_for_real(runtime, enrollment["id"]) == predicted(answer)


def test_an_anchored_reminder_previewed_by_phone_for_a_later_enrollment(
    client: TestClient[Any], runtime: Runtime
) -> None:
    manual(runtime).set(FRIDAY_EVENING)
    phone = "+15550001234"
    contact = new_contact(client, phone=phone, name="Bea")
    sequence = new_sequence(
        client,
        {"kind": "message", "text": "Booked for {{anchor.time}}", "anchor_offset_seconds": -86400},
        {"kind": "message", "text": "See you in an hour", "anchor_offset_seconds": -3600},
    )
    anchor = FRIDAY_EVENING + timedelta(days=3)
    later = FRIDAY_EVENING + timedelta(days=1)

    answer = previewed(
        client, sequence, phone="+1 555 000 1234", anchor_at=anchor.isoformat(), enrolled_at=later.isoformat()
    )

    assert (answer["contact_id"], answer["enrolled_at"]) == (contact, "2030-01-12T21:30:00Z")
    steps = answer["steps"]
    assert [(s["outcome"], s["at"]) for s in steps] == [
        ("queued", "2030-01-13T21:30:00Z"),
        ("queued", "2030-01-14T20:30:00Z"),
    ]
    assert steps[0]["text"].startswith("Booked for ")


def test_a_reminder_whose_time_has_passed_goes_now_within_its_grace_and_is_skipped_past_it(
    client: TestClient[Any], runtime: Runtime
) -> None:
    contact = new_contact(client)
    sequence = new_sequence(
        client,
        {"kind": "message", "text": "In two hours", "anchor_offset_seconds": -7200, "grace_seconds": 3600},
        {"kind": "message", "text": "In one hour", "anchor_offset_seconds": -3600, "grace_seconds": 3600},
    )
    now = manual(runtime).now()
    # the first reminder was due 90 minutes ago (past its grace), the second 30 minutes ago (within it)
    anchor = now + timedelta(minutes=30)

    answer = previewed(client, sequence, contact_id=contact, anchor_at=anchor.isoformat())

    first, second = answer["steps"]
    assert (first["outcome"], first["reason"], _time(first["at"])) == ("skipped", "past_due", now)
    assert (second["outcome"], second["text"], _time(second["at"])) == ("queued", "In one hour", now)
    enrollment = ok(
        client.post(
            "/v1/enrollments",
            json={"sequence_id": sequence, "contact_id": contact, "anchor_at": anchor.isoformat()},
        ),
        201,
    )
    assert released_for_real(runtime, enrollment["id"]) == predicted(answer)


def test_a_paused_sequence_pauses_at_its_first_step_and_the_rest_is_not_reached(
    client: TestClient[Any], runtime: Runtime
) -> None:
    contact = new_contact(client)
    sequence = new_sequence(
        client, {"kind": "message", "text": "one"}, {"kind": "message", "text": "two", "delay_seconds": 60}
    )
    ok(client.post(f"/v1/sequences/{sequence}/pause"))

    steps = previewed(client, sequence, contact_id=contact)["steps"]

    assert [(s["outcome"], s["reason"]) for s in steps] == [
        ("paused", "sequence_paused"),
        ("not_reached", None),
    ]
    assert steps[1]["at"] is None


def test_a_step_held_back_again_and_again_ends_the_preview_there(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # the project's only number is disconnected: each release defers 15 s (the pause comes after 30 min)
    ok(client.post("/v1/numbers", json={"phone": "+15550000009", "status": "disconnected"}), 201)
    contact = new_contact(client)
    sequence = new_sequence(
        client, {"kind": "message", "text": "one"}, {"kind": "message", "text": "two", "delay_seconds": 60}
    )

    counted = sample(PREVIEWS, result="incomplete")

    answer = previewed(client, sequence, contact_id=contact)

    assert answer["complete"] is False
    assert sample(PREVIEWS, result="incomplete") == counted + 1
    first, second = answer["steps"]
    assert first["outcome"] == "deferred" and first["at"] is None
    assert {d["reason"] for d in first["deferrals"]} == {"instance_unavailable"}
    assert len(first["deferrals"]) == 9
    gaps = [_time(d["until"]) - _time(d["at"]) for d in first["deferrals"]]
    assert set(gaps) == {timedelta(seconds=15)}
    assert second["outcome"] == "not_reached"


def test_an_ai_step_with_a_model_configured_says_the_model_would_write_it(
    runtime: Runtime, project: Project, client: TestClient[Any]
) -> None:
    contact = new_contact(client)
    sequence = new_sequence(
        client,
        {"kind": "ai", "instructions": "Say hello", "fallback": {"kind": "skip"}},
        {"kind": "message", "text": "bye"},
    )
    before = table_counts(runtime)

    with runtime.pool.connection() as conn:
        answer = preview(
            conn,
            project.id,
            uuid.UUID(sequence),
            PreviewRequest(contact_id=uuid.UUID(contact)),
            SETTINGS,
            now=runtime.clock.now(),
            ai_lease=timedelta(minutes=2),
        )
        conn.commit()

    first, second = answer.steps
    assert (first.outcome, first.written_by_model, first.text, first.reason) == ("queued", True, None, None)
    assert (second.outcome, second.text) == ("queued", "bye")
    assert table_counts(runtime) == before


# --- who cannot be enrolled ---------------------------------------------------------------------------------


def test_a_contact_that_cannot_be_enrolled_gets_the_rejection_and_no_steps(
    client: TestClient[Any], runtime: Runtime
) -> None:
    sequence = new_sequence(client, {"kind": "message", "text": "one"})
    opted_out = new_contact(client)
    with runtime.pool.connection() as conn:  # as the platform's opt-out event records it
        conn.execute("UPDATE contacts SET opted_out_at = now() WHERE id = %s", (opted_out,))
    enrolled = new_contact(client)
    ok(client.post("/v1/enrollments", json={"sequence_id": sequence, "contact_id": enrolled}), 201)

    for contact, code in ((opted_out, "opted_out"), (enrolled, "already_enrolled")):
        counted = sample(PREVIEWS, result=code)
        answer = previewed(client, sequence, contact_id=contact)
        assert sample(PREVIEWS, result=code) == counted + 1
        assert (answer["rejected"], answer["steps"], answer["version"]) == (code, [], None)
        assert answer["rejected_message"]


# --- bad input ----------------------------------------------------------------------------------------------


def test_bad_input_is_a_problem_naming_the_field(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    contact = new_contact(client)
    sequence = new_sequence(client, {"kind": "message", "text": "one", "anchor_offset_seconds": -3600})
    draft = new_sequence(client, {"kind": "message", "text": "one"}, publish=False)
    with runtime.pool.connection() as conn:
        theirs = conn.execute(
            "INSERT INTO contacts (project_id, phone) VALUES (%s, '+15559990000') RETURNING id",
            (other_project.id,),
        ).fetchone()
    assert theirs is not None
    url = f"/v1/sequences/{sequence}/preview"
    now = runtime.clock.now()
    before = table_counts(runtime)

    assert_problem(client.post(url, json={"contact_id": str(uuid.uuid4())}), 404, "contact_id")
    assert_problem(client.post(url, json={"contact_id": str(theirs[0])}), 404, "contact_id")
    assert_problem(client.post(url, json={"phone": "+15558887777"}), 404, "phone")
    assert_problem(client.post(url, json={"phone": "not a phone"}), (400, 422), "phone")
    assert_problem(client.post(url, json={}), 422, "contact_id")
    assert_problem(client.post(url, json={"contact_id": contact, "phone": "+15558887777"}), 422, "contact_id")
    assert_problem(
        client.post(url, json={"contact_id": contact, "anchor_at": "2030-01-01T09:00:00"}),
        (400, 422),
        "anchor_at",
    )
    assert_problem(
        client.post(url, json={"contact_id": contact, "anchor_at": "tomorrow"}), (400, 422), "anchor_at"
    )
    assert_problem(
        client.post(url, json={"contact_id": contact, "anchor_at": "0001-01-01T00:30:00Z"}), 422, "anchor_at"
    )
    on_anchor = new_sequence(client, {"kind": "message", "text": "one", "anchor_offset_seconds": 0})
    at_anchor = f"/v1/sequences/{on_anchor}/preview"
    assert_problem(
        client.post(at_anchor, json={"contact_id": contact, "anchor_at": "9999-12-31T23:00:00Z"}),
        422,
        "anchor_at",
    )
    past = (now - timedelta(minutes=1)).isoformat()
    assert_problem(client.post(url, json={"contact_id": contact, "enrolled_at": past}), 422, "enrolled_at")
    far = (now + timedelta(days=400)).isoformat()
    assert_problem(client.post(url, json={"contact_id": contact, "enrolled_at": far}), 422, "enrolled_at")
    assert_problem(client.post(url, json={"contact_id": contact, "variables": {"": 1}}), 422, "variables.")
    assert_problem(client.post(url, json={"contact_id": contact, "extra": 1}), (400, 422), "extra")
    assert_problem(
        client.post(f"/v1/sequences/{uuid.uuid4()}/preview", json={"contact_id": contact}), 404, "sequence_id"
    )
    assert_problem(
        client.post(f"/v1/sequences/{draft}/preview", json={"contact_id": contact}), 409, "sequence_id"
    )
    assert table_counts(runtime) == before


# --- one project's previews at once -------------------------------------------------------------------------


def test_a_project_runs_two_previews_at_once_and_a_third_is_refused_without_waiting(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    contact = new_contact(client)
    sequence = new_sequence(client, {"kind": "message", "text": "one"})
    request = PreviewRequest(contact_id=uuid.UUID(contact))
    busy = sample(PREVIEWS, result="busy")
    with runtime.pool.connection() as first, runtime.pool.connection() as second:
        # Given two previews of the project whose transactions have not ended
        for conn in (first, second):
            held = preview(conn, project.id, uuid.UUID(sequence), request, SETTINGS, now=runtime.clock.now())
            assert held.steps[0].outcome == "queued"

        # When a third comes, it is refused at once (429, busy), and another project's is not
        refused = client.post(f"/v1/sequences/{sequence}/preview", json={"contact_id": contact})
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "busy" and refused.headers["retry-after"] == "1"
        assert sample(PREVIEWS, result="busy") == busy + 1
        theirs = PreviewRequest(contact_id=make_contact(runtime.pool, other_project.id))
        their_sequence = make_sequence(runtime.pool, other_project.id)
        with runtime.pool.connection() as conn:
            answer = preview(
                conn, other_project.id, their_sequence, theirs, SETTINGS, now=runtime.clock.now()
            )
        assert answer.steps[0].outcome == "queued"
        first.commit()

    # Then, a slot free again, the next one runs
    assert previewed(client, sequence, contact_id=contact)["steps"][0]["outcome"] == "queued"


def test_a_preview_holds_no_counter_row_nor_the_plan_lock_a_real_release_would_wait_for(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    # Given a plan-limited project whose every counter row (live enrollments, usage this month, messages
    # queued) and whose plan lock another transaction holds, as a real enrollment or release in flight does
    contact = new_contact(client)
    sequence = new_sequence(client, {"kind": "message", "text": "one"}, {"kind": "message", "text": "two"})
    month = runtime.clock.now().astimezone(UTC).date().replace(day=1)
    answers: list[Any] = []
    with runtime.pool.connection() as holder:
        holder.execute("UPDATE projects SET max_active_enrollments = 1000 WHERE id = %s", (project.id,))
        holder.commit()
        holder.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('plan/' || %s::text, 0))", (project.id,)
        )
        for shard in range(16):
            holder.execute(
                "INSERT INTO followup_live_counters VALUES (%s, %s, 0) ON CONFLICT DO NOTHING",
                (project.id, shard),
            )
            holder.execute(
                "INSERT INTO usage_counters (project_id, month, shard, messages) VALUES (%s, %s, %s, 0)"
                " ON CONFLICT DO NOTHING",
                (project.id, month, shard),
            )
            holder.execute(
                "INSERT INTO message_counters (project_id, kind, owner_id, shard, messages)"
                " VALUES (%s, 'project_queued', %s, %s, 0) ON CONFLICT DO NOTHING",
                (project.id, project.id, shard),
            )
        for table in ("followup_live_counters", "usage_counters", "message_counters"):
            holder.execute(f"SELECT 1 FROM {table} WHERE project_id = %s FOR UPDATE", (project.id,))

        # When the contact's schedule is previewed meanwhile
        worker = threading.Thread(
            target=lambda: answers.append(previewed(client, sequence, contact_id=contact))
        )
        worker.start()
        worker.join(timeout=30)
        waited = worker.is_alive()
    worker.join()

    # Then it answered without waiting for them, both steps queued
    assert not waited, "the preview waited for a counter row or the plan lock"
    assert [s["outcome"] for s in answers[0]["steps"]] == ["queued", "queued"]
