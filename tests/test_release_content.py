"""What a released step sends: templates (variables, the anchor in the contact's time zone, the
contact name's fallback, missing values and too long texts skipping the step) and AI steps (their fallback
template or skip, media and the enrollment's number on the message).

Domain-level scenarios of the release path (seed 000, "Release (one step, one transaction)"), driven on
the controllable clock: what each release leaves behind in messages, step runs, the enrollment, the outbox
and the metrics.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.followups.definition import AiStep, MessageStep, SkipFallback, TemplateFallback
from libs.common.followups.enrollments import EnrollmentUpdate, update_enrollment
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment
from tests.helpers import rows
from tests.release_helpers import (
    STEPS,
    Metrics,
    bodies,
    count,
    events,
    messages,
    release,
    sequence,
    state,
    step_runs,
)

# --- templates -------------------------------------------------------------------------------------------


def test_a_missing_variable_skips_the_step_and_sends_nothing(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="Your order {{vars.x}} shipped"))
    enrollment = make_enrollment(
        pool, clock, project.id, seq, make_contact(pool, project.id), variables={"y": "1"}
    )
    metrics = Metrics((STEPS, {"action": "skip", "outcome": "missing_variable"}))
    result = release(pool, clock)
    assert (result.action, result.reason) == ("skip", "missing_variable:vars.x")
    assert count(pool, "messages") == 0
    assert count(pool, "conversations") == 0
    assert step_runs(pool, enrollment.id) == [(0, "skipped", "missing_variable:vars.x")]
    assert state(pool, enrollment.id)[:2] == ("completed", None)
    assert events(pool) == ["followup.step_skipped", "followup.completed"]
    assert metrics.delta(STEPS, action="skip", outcome="missing_variable") == 1


def test_a_text_its_values_make_longer_than_a_message_may_be_skips_the_step(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given a template within the 4,096 characters and a variable that takes it past them
    seq = sequence(pool, project.id, MessageStep(text="Your notes: {{vars.notes}}"))
    notes = "n" * 4090
    enrollment = make_enrollment(
        pool, clock, project.id, seq, make_contact(pool, project.id), variables={"notes": notes}
    )
    # When it is released, nothing is queued (WhatsApp would refuse it): the step is skipped with a reason
    result = release(pool, clock)
    assert (result.action, result.reason) == ("skip", "message_too_long")
    assert count(pool, "messages") == 0
    assert step_runs(pool, enrollment.id) == [(0, "skipped", "message_too_long")]


def test_variables_render_and_a_variable_set_later_is_used(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(
        pool, project.id, MessageStep(text="Order {{vars.order.id}}: {{vars.n}}", delay_seconds=60)
    )
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    with pool.connection() as conn:
        update_enrollment(
            conn,
            project.id,
            enrollment.id,
            EnrollmentUpdate(variables={"order": {"id": "A-1"}, "n": 3}),
            now=clock.now(),
        )
    clock.advance(timedelta(seconds=60))
    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == ["Order A-1: 3"]


@pytest.mark.parametrize(
    ("contact_zone", "project_zone", "expected"),
    [
        ("Asia/Tokyo", "Europe/Berlin", "2030-01-03 03:30 Thursday"),
        (None, "Europe/Berlin", "2030-01-02 19:30 Wednesday"),
        (None, "UTC", "2030-01-02 18:30 Wednesday"),
    ],
)
def test_the_anchor_is_rendered_in_the_contacts_time_zone(
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    contact_zone: str | None,
    project_zone: str,
    expected: str,
) -> None:
    with pool.connection() as conn:
        conn.execute("UPDATE projects SET timezone = %s WHERE id = %s", (project_zone, project.id))
    seq = sequence(pool, project.id, MessageStep(text="{{anchor.date}} {{anchor.time}} {{anchor.weekday}}"))
    anchor = datetime(2030, 1, 2, 18, 30, tzinfo=UTC)
    contact = make_contact(pool, project.id, timezone=contact_zone)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact, anchor_at=anchor)
    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == [expected]


@pytest.mark.parametrize(("name", "expected"), [("Ana", "Hi Ana!"), (None, "Hi there!")])
def test_the_contact_name_falls_back(
    pool: ConnectionPool, clock: ManualClock, project: Project, name: str | None, expected: str
) -> None:
    seq = sequence(pool, project.id, MessageStep(text='Hi {{ contact.name | "there" }}!'))
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id, name=name))
    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == [expected]


def test_a_missing_contact_name_without_fallback_skips(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="Hi {{contact.name}}"))
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    result = release(pool, clock)
    assert (result.action, result.reason) == ("skip", "missing_variable:contact.name")
    assert count(pool, "messages") == 0
    assert step_runs(pool, enrollment.id) == [(0, "skipped", "missing_variable:contact.name")]


# --- AI steps --------------------------------------------------------------------------------------------


def test_an_ai_step_without_a_model_sends_its_fallback_template(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(
        pool,
        project.id,
        AiStep(
            instructions="Ask how the demo went",
            fallback=TemplateFallback(text='How did the demo go, {{contact.name | "friend"}}?'),
        ),
    )
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id, name="Bo"))
    metrics = Metrics((STEPS, {"action": "queue", "outcome": "ai_fallback"}))
    result = release(pool, clock)
    assert (result.action, result.reason) == ("queue", "ai_fallback:model_unavailable")
    assert messages(pool, enrollment.id) == [
        ("How did the demo go, Bo?", "QUEUED", 0, "followup", "outbound")
    ]
    assert step_runs(pool, enrollment.id) == [(0, "queued", "ai_fallback:model_unavailable")]
    assert state(pool, enrollment.id)[:2] == ("completed", None)
    assert events(pool) == ["message.queued", "followup.step_queued", "followup.completed"]
    queued = rows(pool, "SELECT data->>'reason' FROM outbox WHERE type = 'followup.step_queued'")
    assert queued == [("ai_fallback:model_unavailable",)]
    assert metrics.delta(STEPS, action="queue", outcome="ai_fallback") == 1


def test_an_ai_step_with_a_skip_fallback_is_skipped_ai_unavailable(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(
        pool,
        project.id,
        AiStep(instructions="Ask how the demo went", fallback=SkipFallback()),
        MessageStep(text="bye", delay_seconds=60),
    )
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    result = release(pool, clock)
    assert (result.action, result.reason) == ("skip", "ai_unavailable")
    assert count(pool, "messages") == 0
    assert step_runs(pool, enrollment.id) == [(0, "skipped", "ai_unavailable")]
    assert state(pool, enrollment.id) == ("active", None, 1, clock.now() + timedelta(seconds=60))


def test_media_and_the_enrollments_number_go_on_the_message(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    with pool.connection() as conn:
        row = conn.execute(
            "INSERT INTO numbers (project_id, phone) VALUES (%s, '+15550000001') RETURNING id", (project.id,)
        ).fetchone()
    assert row is not None
    number: uuid.UUID = row[0]
    seq = sequence(
        pool,
        project.id,
        MessageStep(text="the brochure", media_url="https://example.com/b.pdf", media_kind="document"),
    )
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact, number_id=number)
    assert release(pool, clock).action == "queue"
    sent = rows(
        pool,
        "SELECT m.media_url, m.media_kind, m.number_id, m.priority, c.number_id FROM messages m"
        " JOIN conversations c ON c.id = m.conversation_id WHERE m.followup_enrollment_id = %s",
        enrollment.id,
    )
    assert sent == [("https://example.com/b.pdf", "document", number, 5, number)]
    assert rows(pool, "SELECT status, message_id IS NOT NULL FROM message_status_events") == [
        ("QUEUED", True)
    ]
    assert rows(pool, "SELECT sum(messages) FROM usage_counters") == [(1,)]
    assert rows(pool, "SELECT kind, contact_id FROM activities") == [("followup_sent", contact)]
