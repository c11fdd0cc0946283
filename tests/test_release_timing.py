"""When a step is released: reminders before their anchor and their grace (past due, a missing or
rescheduled anchor), releases deferred to the anchor time, and the release lag histogram.

Domain-level scenarios of the release path (seed 000, "Release (one step, one transaction)"), driven on
the controllable clock: what each release leaves behind in messages, step runs, the enrollment, the outbox
and the metrics.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.followups.definition import MessageStep
from libs.common.followups.enrollments import EnrollmentUpdate, update_enrollment
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment
from tests.helpers import rows
from tests.release_helpers import (
    DAY,
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

LAG = "whatstig_followup_release_lag_seconds"


# --- timing ----------------------------------------------------------------------------------------------

REMINDER = MessageStep(text="See you at {{anchor.time}}", anchor_offset_seconds=-7200, grace_seconds=3600)


def test_a_reminder_is_released_two_hours_before_its_anchor(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, REMINDER)
    anchor = clock.now() + DAY
    enrollment = make_enrollment(
        pool, clock, project.id, seq, make_contact(pool, project.id), anchor_at=anchor
    )
    assert state(pool, enrollment.id)[3] == anchor - 2 * HOUR

    clock.set(anchor - 2 * HOUR - timedelta(seconds=1))
    assert release_all(pool, clock) == 0
    # released within the grace (30 min late): queued
    clock.set(anchor - 2 * HOUR + timedelta(minutes=30))
    result = release(pool, clock)
    assert (result.action, result.reason) == ("queue", None)
    assert bodies(pool, enrollment.id) == ["See you at 09:00"]
    assert step_runs(pool, enrollment.id) == [(0, "queued", None)]
    assert state(pool, enrollment.id)[:2] == ("completed", None)


def test_a_reminder_released_at_the_end_of_its_grace_is_still_queued(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, REMINDER)
    anchor = clock.now() + DAY
    enrollment = make_enrollment(
        pool, clock, project.id, seq, make_contact(pool, project.id), anchor_at=anchor
    )
    clock.set(anchor - HOUR)  # due + grace, exactly
    assert release(pool, clock).action == "queue"
    assert step_runs(pool, enrollment.id) == [(0, "queued", None)]


def test_a_reminder_released_after_its_grace_is_skipped_past_due(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, REMINDER)
    anchor = clock.now() + DAY
    enrollment = make_enrollment(
        pool, clock, project.id, seq, make_contact(pool, project.id), anchor_at=anchor
    )
    metrics = Metrics((STEPS, {"action": "skip", "outcome": "past_due"}))
    clock.set(anchor - HOUR + timedelta(seconds=1))
    result = release(pool, clock)

    assert (result.action, result.reason) == ("skip", "past_due")
    assert count(pool, "messages") == 0
    assert step_runs(pool, enrollment.id) == [(0, "skipped", "past_due")]
    assert state(pool, enrollment.id)[:3] == ("completed", None, 1)
    assert events(pool) == ["followup.step_skipped", "followup.completed"]
    assert metrics.delta(STEPS, action="skip", outcome="past_due") == 1


def test_a_reminder_of_an_enrollment_without_anchor_is_skipped_missing_anchor(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, REMINDER, MessageStep(text="after", delay_seconds=60))
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    result = release(pool, clock)
    assert (result.action, result.reason) == ("skip", "missing_anchor")
    assert step_runs(pool, enrollment.id) == [(0, "skipped", "missing_anchor")]
    assert state(pool, enrollment.id) == ("active", None, 1, clock.now() + timedelta(seconds=60))
    assert count(pool, "messages") == 0
    clock.advance(timedelta(seconds=60))
    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == ["after"]
    assert events(pool) == [
        "followup.step_skipped",
        "message.queued",
        "followup.step_queued",
        "followup.completed",
    ]


def test_a_rescheduled_anchor_moves_the_reminder_and_nothing_is_sent_early(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, REMINDER)
    anchor = clock.now() + DAY
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact, anchor_at=anchor)

    # the appointment moves a day later
    clock.advance(HOUR)
    later = anchor + DAY
    with pool.connection() as conn:
        update_enrollment(conn, project.id, enrollment.id, EnrollmentUpdate(anchor_at=later), now=clock.now())
    assert state(pool, enrollment.id) == ("active", None, 0, later - 2 * HOUR)

    clock.set(anchor - 2 * HOUR)  # the old due time
    assert release_all(pool, clock) == 0
    clock.set(later - 2 * HOUR - timedelta(seconds=1))
    assert release_all(pool, clock) == 0
    clock.set(later - 2 * HOUR)
    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == ["See you at 09:00"]
    assert rows(pool, "SELECT due_at FROM followup_step_runs") == [(later - 2 * HOUR,)]


def test_a_release_due_before_the_anchor_time_defers_to_it(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, REMINDER)
    anchor = clock.now() + DAY
    enrollment = make_enrollment(
        pool, clock, project.id, seq, make_contact(pool, project.id), anchor_at=anchor
    )
    # the anchor moved without the due time (or the due time is earlier than the anchor's)
    with pool.connection() as conn:
        conn.execute("UPDATE followup_enrollments SET next_run_at = %s", (clock.now(),))
    metrics = Metrics((STEPS, {"action": "defer", "outcome": "rescheduled"}))

    result = release(pool, clock)
    assert (result.action, result.reason) == ("defer", "rescheduled")
    assert state(pool, enrollment.id) == ("active", None, 0, anchor - 2 * HOUR)
    assert count(pool, "messages") == 0
    assert count(pool, "followup_step_runs") == 0
    assert events(pool) == []
    assert metrics.delta(STEPS, action="defer", outcome="rescheduled") == 1

    # an anchor moved later behind the enrollment's back is deferred too
    with pool.connection() as conn:
        conn.execute("UPDATE followup_enrollments SET anchor_at = %s", (anchor + HOUR,))
    clock.set(anchor - 2 * HOUR)
    result = release(pool, clock)
    assert (result.action, result.reason) == ("defer", "rescheduled")
    assert state(pool, enrollment.id)[3] == anchor - HOUR
    assert count(pool, "messages") == 0
    clock.set(anchor - HOUR)
    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == ["See you at 10:00"]


def test_a_confirmation_then_a_reminder_before_the_anchor(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="Booked for {{anchor.datetime}}"), REMINDER)
    anchor = clock.now() + 3 * DAY
    enrollment = make_enrollment(
        pool, clock, project.id, seq, make_contact(pool, project.id), anchor_at=anchor
    )
    assert release(pool, clock).action == "queue"
    # the reminder is scheduled from the anchor, not from the previous step
    assert state(pool, enrollment.id) == ("active", None, 1, anchor - 2 * HOUR)
    clock.set(anchor - 2 * HOUR - timedelta(seconds=1))
    assert release_all(pool, clock) == 0
    clock.set(anchor - 2 * HOUR)
    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == ["Booked for 2030-01-04 09:00", "See you at 09:00"]
    assert state(pool, enrollment.id)[:3] == ("completed", None, 2)


# --- release lag -----------------------------------------------------------------------------------------


def test_the_release_lag_histogram_observes_queued_minus_due_time(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one", delay_seconds=600))
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    metrics = Metrics(
        (f"{LAG}_sum", {}),
        (f"{LAG}_count", {}),
        (f"{LAG}_bucket", {"le": "60.0"}),
        (f"{LAG}_bucket", {"le": "300.0"}),
    )
    clock.advance(timedelta(seconds=600 + 90))
    assert release(pool, clock).action == "queue"
    assert metrics.delta(f"{LAG}_sum") == pytest.approx(90)
    assert metrics.delta(f"{LAG}_count") == 1
    assert metrics.delta(f"{LAG}_bucket", le="60.0") == 0
    assert metrics.delta(f"{LAG}_bucket", le="300.0") == 1
    assert rows(
        pool, "SELECT ran_at - due_at FROM followup_step_runs WHERE enrollment_id = %s", enrollment.id
    ) == [(timedelta(seconds=90),)]


def test_a_skipped_step_is_not_observed_as_release_lag(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="{{vars.x}}"))
    make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    metrics = Metrics((f"{LAG}_count", {}))
    assert release(pool, clock).action == "skip"
    assert metrics.delta(f"{LAG}_count") == 0
