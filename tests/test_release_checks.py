"""Whether a due step is sent: the checks at release (a failing check, a reply since enrollment, the
stop-on-reply setting) and the ``only_if`` conditions (no reply since the previous step or the enrollment,
the previous message not read).

Domain-level scenarios of the release path (seed 000, "Release (one step, one transaction)"), driven on
the controllable clock: what each release leaves behind in messages, step runs, the enrollment, the outbox
and the metrics.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.followups.definition import MessageStep, StopFlags
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, record_reply
from tests.helpers import rows
from tests.release_helpers import (
    FINISHED,
    HOUR,
    STEPS,
    Metrics,
    bodies,
    count,
    events,
    release,
    release_all,
    sequence,
    state,
    step_runs,
)


def reply(pool: ConnectionPool, project_id: uuid.UUID, contact_id: uuid.UUID, at: datetime) -> None:
    """The contact writes in (recorded, without the ingress's stop path)."""
    record_reply(pool, project_id, contact_id, at, "hi")


# --- the checks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("UPDATE projects SET plan_active = false WHERE id = %(project)s", "plan_lost"),
        ("UPDATE contacts SET opted_out_at = now() WHERE id = %(contact)s", "opted_out"),
        ("UPDATE contacts SET erased_at = now(), phone = NULL WHERE id = %(contact)s", "contact_erased"),
    ],
)
def test_a_check_that_fails_at_release_stops_the_enrollment_and_sends_nothing(
    pool: ConnectionPool, clock: ManualClock, project: Project, change: str, reason: str
) -> None:
    seq = sequence(
        pool, project.id, MessageStep(text="first"), MessageStep(text="second", delay_seconds=3600)
    )
    contact = make_contact(pool, project.id, name="Ana")
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    assert release(pool, clock).action == "queue"
    metrics = Metrics(
        (FINISHED, {"status": "stopped", "reason": reason}), (STEPS, {"action": "stop", "outcome": reason})
    )

    with pool.connection() as conn:
        conn.execute(change, {"project": project.id, "contact": contact})
    clock.advance(HOUR)
    result = release(pool, clock)

    assert (result.action, result.reason) == ("stop", reason)
    assert state(pool, enrollment.id)[:3] == ("stopped", reason, 1)
    assert bodies(pool, enrollment.id) == ["first"]
    assert step_runs(pool, enrollment.id) == [(0, "queued", None)]
    assert events(pool) == ["message.queued", "followup.step_queued", "followup.stopped"]
    stopped = rows(pool, "SELECT data->>'reason' FROM outbox WHERE type = 'followup.stopped'")
    assert stopped == [(reason,)]
    assert rows(pool, "SELECT finished_at FROM followup_enrollments")[0][0] == clock.now()
    assert metrics.delta(FINISHED, status="stopped", reason=reason) == 1
    assert metrics.delta(STEPS, action="stop", outcome=reason) == 1
    assert release_all(pool, clock) == 0


def test_a_reply_since_enrollment_stops_the_enrollment_at_release_the_backstop(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(
        pool, project.id, MessageStep(text="first"), MessageStep(text="second", delay_seconds=3600)
    )
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    assert release(pool, clock).action == "queue"

    # the contact replies; its own stop path did not run (or lost the race)
    clock.advance(timedelta(minutes=10))
    reply(pool, project.id, contact, clock.now())
    clock.advance(HOUR)
    result = release(pool, clock)

    assert (result.action, result.reason) == ("stop", "replied")
    assert state(pool, enrollment.id)[:3] == ("stopped", "replied", 1)
    assert bodies(pool, enrollment.id) == ["first"]
    assert step_runs(pool, enrollment.id) == [(0, "queued", None)]
    assert events(pool) == ["message.queued", "followup.step_queued", "followup.stopped"]


def test_a_reply_before_the_enrollment_does_not_stop_it(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="first", delay_seconds=60))
    contact = make_contact(pool, project.id)
    reply(pool, project.id, contact, clock.now() - timedelta(minutes=5))
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    clock.advance(timedelta(minutes=1))
    assert release(pool, clock).action == "queue"
    assert state(pool, enrollment.id)[:2] == ("completed", None)


def test_with_stop_on_reply_off_a_reply_does_not_stop_the_enrollment(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(
        pool,
        project.id,
        MessageStep(text="first"),
        MessageStep(text="second", delay_seconds=3600),
        stop_on=StopFlags(reply=False),
    )
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    assert release(pool, clock).action == "queue"
    clock.advance(timedelta(minutes=10))
    reply(pool, project.id, contact, clock.now())
    clock.advance(HOUR)

    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == ["first", "second"]
    assert state(pool, enrollment.id)[:3] == ("completed", None, 2)
    assert events(pool) == [
        "message.queued",
        "followup.step_queued",
        "message.queued",
        "followup.step_queued",
        "followup.completed",
    ]


# --- only_if ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("replied", [True, False])
def test_only_if_no_reply_since_previous_step(
    pool: ConnectionPool, clock: ManualClock, project: Project, replied: bool
) -> None:
    seq = sequence(
        pool,
        project.id,
        MessageStep(text="first", delay_seconds=3600),
        MessageStep(text="second", delay_seconds=3600, only_if=["no_reply_since_previous_step"]),
        stop_on=StopFlags(reply=False),
    )
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    # a reply before the first step does not count against the second
    clock.advance(timedelta(minutes=10))
    reply(pool, project.id, contact, clock.now())
    clock.advance(timedelta(minutes=50))
    assert release(pool, clock).action == "queue"
    if replied:
        clock.advance(timedelta(minutes=10))
        reply(pool, project.id, contact, clock.now())
        clock.advance(timedelta(minutes=50))
    else:
        clock.advance(HOUR)
    result = release(pool, clock)

    if replied:
        assert (result.action, result.reason) == ("skip", "only_if:no_reply_since_previous_step")
        assert bodies(pool, enrollment.id) == ["first"]
        assert step_runs(pool, enrollment.id) == [
            (0, "queued", None),
            (1, "skipped", "only_if:no_reply_since_previous_step"),
        ]
    else:
        assert (result.action, result.reason) == ("queue", None)
        assert bodies(pool, enrollment.id) == ["first", "second"]
    assert state(pool, enrollment.id)[:3] == ("completed", None, 2)


@pytest.mark.parametrize("replied", [True, False])
def test_only_if_no_reply_since_enrollment(
    pool: ConnectionPool, clock: ManualClock, project: Project, replied: bool
) -> None:
    seq = sequence(
        pool,
        project.id,
        MessageStep(text="nudge", delay_seconds=3600, only_if=["no_reply_since_enrollment"]),
        stop_on=StopFlags(reply=False),
    )
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    clock.advance(timedelta(minutes=10))
    if replied:
        reply(pool, project.id, contact, clock.now())
    clock.advance(timedelta(minutes=50))
    result = release(pool, clock)
    if replied:
        assert (result.action, result.reason) == ("skip", "only_if:no_reply_since_enrollment")
        assert count(pool, "messages WHERE direction = 'outbound'") == 0
        assert step_runs(pool, enrollment.id) == [(0, "skipped", "only_if:no_reply_since_enrollment")]
        assert events(pool) == ["followup.step_skipped", "followup.completed"]
    else:
        assert result.action == "queue"
        assert bodies(pool, enrollment.id) == ["nudge"]
    assert state(pool, enrollment.id)[:2] == ("completed", None)


@pytest.mark.parametrize("read", [True, False])
def test_only_if_previous_not_read(
    pool: ConnectionPool, clock: ManualClock, project: Project, read: bool
) -> None:
    seq = sequence(
        pool,
        project.id,
        MessageStep(text="first"),
        MessageStep(text="did you see it?", delay_seconds=3600, only_if=["previous_not_read"]),
    )
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    first = release(pool, clock)
    assert first.message_id is not None
    with pool.connection() as conn:
        conn.execute("UPDATE messages SET status = 'SENT' WHERE id = %s", (first.message_id,))
        if read:
            conn.execute("UPDATE messages SET status = 'READ' WHERE id = %s", (first.message_id,))
    clock.advance(HOUR)
    result = release(pool, clock)
    if read:
        assert (result.action, result.reason) == ("skip", "only_if:previous_not_read")
        assert bodies(pool, enrollment.id) == ["first"]
        assert step_runs(pool, enrollment.id)[1] == (1, "skipped", "only_if:previous_not_read")
    else:
        assert result.action == "queue"
        assert bodies(pool, enrollment.id) == ["first", "did you see it?"]
    assert state(pool, enrollment.id)[:2] == ("completed", None)
