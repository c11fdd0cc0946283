"""Domain-level scenarios of the release path (seed 000, "Release (one step, one transaction)"), driven on
the controllable clock: what each release leaves behind in messages, step runs, the enrollment, the
outbox and the metrics."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.settings import FollowupSettings
from libs.common.followups.definition import (
    AiStep,
    Definition,
    MessageStep,
    SkipFallback,
    Step,
    StopFlags,
    TemplateFallback,
)
from libs.common.followups.enrollments import EnrollmentUpdate, EnrollRequest, enroll, update_enrollment
from libs.common.followups.release_step import Released
from libs.common.followups.sequences import (
    SequenceCreate,
    SequenceUpdate,
    change_sequence_status,
    create_sequence,
    publish_sequence,
    update_sequence,
)
from services.release.release import release_batch, release_one
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, record_reply
from tests.helpers import rows

SETTINGS = FollowupSettings()
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


# --- helpers ---------------------------------------------------------------------------------------------


def sequence(pool: ConnectionPool, project_id: uuid.UUID, *steps: Step, **options: Any) -> uuid.UUID:
    """A published sequence of ``steps`` (message or AI steps)."""
    with pool.connection() as conn:
        created = create_sequence(
            conn,
            project_id,
            SequenceCreate(
                name=f"seq {uuid.uuid4().hex[:6]}", definition=Definition(steps=list(steps), **options)
            ),
        )
        publish_sequence(conn, project_id, created.id)
    return created.id


def release(pool: ConnectionPool, clock: ManualClock) -> Released:
    """Release one step, which must be due."""
    result = release_one(pool, clock, SETTINGS)
    assert result is not None, "nothing was due"
    return result


def release_all(pool: ConnectionPool, clock: ManualClock) -> int:
    return release_batch(pool, clock, SETTINGS)


def release_without_waiting(
    pool: ConnectionPool, clock: ManualClock, seconds: float = 5.0
) -> Released | None:
    """release_one in a thread: fails if it is still waiting (for a lock) after ``seconds``."""
    box: list[Released | None] = []
    thread = threading.Thread(target=lambda: box.append(release_one(pool, clock, SETTINGS)), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the release waited for a lock"
    assert time.monotonic() - started < 2, "the release took too long: it waited"
    return box[0]


def reply(pool: ConnectionPool, project_id: uuid.UUID, contact_id: uuid.UUID, at: datetime) -> None:
    """The contact writes in (recorded, without the ingress's stop path)."""
    record_reply(pool, project_id, contact_id, at, "hi")


def messages(pool: ConnectionPool, enrollment_id: uuid.UUID) -> list[tuple[Any, ...]]:
    """(body, status, step index, source, direction) of an enrollment's messages, in step order."""
    return rows(
        pool,
        "SELECT body, status, followup_step_index, source, direction FROM messages"
        " WHERE followup_enrollment_id = %s ORDER BY followup_step_index",
        enrollment_id,
    )


def bodies(pool: ConnectionPool, enrollment_id: uuid.UUID) -> list[str]:
    return [m[0] for m in messages(pool, enrollment_id)]


def step_runs(pool: ConnectionPool, enrollment_id: uuid.UUID) -> list[tuple[Any, ...]]:
    """(step index, outcome, reason) of an enrollment's step runs."""
    return rows(
        pool,
        "SELECT step_index, outcome, reason FROM followup_step_runs WHERE enrollment_id = %s"
        " ORDER BY step_index",
        enrollment_id,
    )


def state(pool: ConnectionPool, enrollment_id: uuid.UUID) -> tuple[Any, ...]:
    """(status, reason, step index, next_run_at) of an enrollment."""
    return rows(
        pool,
        "SELECT status, reason, step_index, next_run_at FROM followup_enrollments WHERE id = %s",
        enrollment_id,
    )[0]


def events(pool: ConnectionPool, enrollment_id: uuid.UUID | None = None) -> list[str]:
    """Outbox event types in order (of one enrollment and its messages, when given); the contact's replies'
    own ``message.received`` left out."""
    if enrollment_id is None:
        return [
            r[0] for r in rows(pool, "SELECT type FROM outbox WHERE type <> 'message.received' ORDER BY id")
        ]
    return [
        r[0]
        for r in rows(
            pool,
            "SELECT type FROM outbox WHERE aggregate_id = %s OR data->>'followup_enrollment_id' = %s::text"
            " ORDER BY id",
            enrollment_id,
            enrollment_id,
        )
    ]


def count(pool: ConnectionPool, table: str) -> int:
    value: int = rows(pool, f"SELECT count(*) FROM {table}")[0][0]
    return value


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Metrics:
    """Deltas of Prometheus samples since construction."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self._start = {
            (name, tuple(sorted(labels.items()))): sample(name, **labels) for name, labels in samples
        }

    def delta(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return sample(name, **labels) - self._start[key]


STEPS = "whatstig_followup_steps_total"
FINISHED = "whatstig_followup_finished_total"
LAG = "whatstig_followup_release_lag_seconds"


def conversation(
    pool: ConnectionPool, project_id: uuid.UUID, contact_id: uuid.UUID, *, status: str, created_at: datetime
) -> uuid.UUID:
    with pool.connection() as conn:
        row = conn.execute(
            "INSERT INTO conversations (project_id, contact_id, status, created_at)"
            " VALUES (%s, %s, %s, %s) RETURNING id",
            (project_id, contact_id, status, created_at),
        ).fetchone()
    assert row is not None
    conversation_id: uuid.UUID = row[0]
    return conversation_id


@contextmanager
def locked_conversation(pool: ConnectionPool, conversation_id: uuid.UUID) -> Iterator[Connection[Any]]:
    """Another transaction (an inbox reply, say) holds the conversation row while the block runs."""
    with pool.connection() as locker:
        locker.execute("SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,))
        yield locker


# --- a sequence over days --------------------------------------------------------------------------------


def test_a_three_step_sequence_over_three_days_sends_each_step_once_on_its_day(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given a three-step sequence: day 0, day 1 and day 2
    seq = sequence(
        pool,
        project.id,
        MessageStep(text="day 0"),
        MessageStep(text="day 1", delay_seconds=86400),
        MessageStep(text="day 2", delay_seconds=86400),
    )
    start = clock.now()
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    metrics = Metrics(
        (STEPS, {"action": "queue", "outcome": "sent"}), (FINISHED, {"status": "completed", "reason": "none"})
    )

    for day in range(3):
        # nothing is released a second early, and everything due is released exactly once
        clock.set(start + day * DAY - timedelta(seconds=1))
        assert release_all(pool, clock) == 0
        clock.set(start + day * DAY)
        assert release_all(pool, clock) == 1
        assert release_all(pool, clock) == 0
        assert bodies(pool, enrollment.id) == [f"day {d}" for d in range(day + 1)]
        if day < 2:
            assert state(pool, enrollment.id) == ("active", None, day + 1, start + (day + 1) * DAY)

    # a week later nothing more happens
    clock.advance(7 * DAY)
    assert release_all(pool, clock) == 0

    assert messages(pool, enrollment.id) == [
        (f"day {d}", "QUEUED", d, "followup", "outbound") for d in range(3)
    ]
    assert step_runs(pool, enrollment.id) == [(0, "queued", None), (1, "queued", None), (2, "queued", None)]
    due = rows(pool, "SELECT due_at, ran_at FROM followup_step_runs ORDER BY step_index")
    assert due == [(start + d * DAY, start + d * DAY) for d in range(3)]
    status, reason, step_index, _ = state(pool, enrollment.id)
    assert (status, reason, step_index) == ("completed", None, 3)
    assert rows(pool, "SELECT finished_at FROM followup_enrollments")[0][0] == start + 2 * DAY
    assert events(pool) == [
        "message.queued",
        "followup.step_queued",
        "message.queued",
        "followup.step_queued",
        "message.queued",
        "followup.step_queued",
        "followup.completed",
    ]
    assert metrics.delta(STEPS, action="queue", outcome="sent") == 3
    assert metrics.delta(FINISHED, status="completed", reason="none") == 1
    # the step run points at its message; the enrollment at the last one
    linked = rows(
        pool,
        "SELECT count(*) FROM followup_step_runs r JOIN messages m ON m.id = r.message_id"
        " AND m.followup_step_index = r.step_index",
    )
    assert linked == [(3,)]
    assert rows(
        pool, "SELECT m.body FROM followup_enrollments e JOIN messages m ON m.id = e.last_message_id"
    ) == [("day 2",)]


# --- a paused sequence -----------------------------------------------------------------------------------


def test_a_paused_sequence_pauses_its_enrollments_at_release_and_resuming_releases_them(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="hello", delay_seconds=3600))
    enrollments = [
        make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id)) for _ in range(2)
    ]
    with pool.connection() as conn:
        change_sequence_status(conn, project.id, seq, "pause", now=clock.now())
    metrics = Metrics((STEPS, {"action": "pause", "outcome": "sequence_paused"}))

    # When the step falls due while the sequence is paused
    clock.advance(HOUR)
    results = [release(pool, clock) for _ in enrollments]
    assert {(r.action, r.reason) for r in results} == {("pause", "sequence_paused")}
    assert release_all(pool, clock) == 0
    # Then the enrollments are paused, nothing sent, no step run
    for enrollment in enrollments:
        assert state(pool, enrollment.id)[:3] == ("paused", "sequence_paused", 0)
    assert count(pool, "messages") == 0
    assert count(pool, "followup_step_runs") == 0
    assert metrics.delta(STEPS, action="pause", outcome="sequence_paused") == 2
    clock.advance(DAY)
    assert release_all(pool, clock) == 0

    # When the sequence is resumed: active again, due now, and released
    with pool.connection() as conn:
        change_sequence_status(conn, project.id, seq, "resume", now=clock.now())
    for enrollment in enrollments:
        assert state(pool, enrollment.id) == ("active", None, 0, clock.now())
    assert release_all(pool, clock) == 2
    for enrollment in enrollments:
        assert bodies(pool, enrollment.id) == ["hello"]
        assert step_runs(pool, enrollment.id) == [(0, "queued", None)]
        assert state(pool, enrollment.id)[:3] == ("completed", None, 1)


def test_a_manually_paused_enrollment_is_not_resumed_by_resuming_the_sequence(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    from libs.common.followups.enrollments import pause_enrollment

    seq = sequence(pool, project.id, MessageStep(text="hello", delay_seconds=60))
    by_hand = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    with pool.connection() as conn:
        pause_enrollment(conn, project.id, by_hand.id, now=clock.now())
        change_sequence_status(conn, project.id, seq, "pause", now=clock.now())
        change_sequence_status(conn, project.id, seq, "resume", now=clock.now())
    clock.advance(HOUR)
    assert release_all(pool, clock) == 0
    assert state(pool, by_hand.id)[:2] == ("paused", "manual")


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


# --- version pinning -------------------------------------------------------------------------------------


def test_a_running_enrollment_keeps_its_version_after_a_republish(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(
        pool, project.id, MessageStep(text="old 0"), MessageStep(text="old 1", delay_seconds=86400)
    )
    running = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    assert release(pool, clock).action == "queue"

    # the draft is edited and published again (one step fewer, new texts)
    with pool.connection() as conn:
        update_sequence(
            conn,
            project.id,
            seq,
            SequenceUpdate(
                definition=Definition(
                    steps=[
                        MessageStep(text="new 0"),
                        MessageStep(text="new 1", delay_seconds=86400),
                        MessageStep(text="new 2", delay_seconds=86400),
                    ]
                )
            ),
        )
        publish_sequence(conn, project.id, seq)
    newer = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    assert newer.version_id != running.version_id

    assert release(pool, clock).action == "queue"
    clock.advance(DAY)
    assert release_all(pool, clock) == 2
    clock.advance(DAY)
    assert release_all(pool, clock) == 1

    assert bodies(pool, running.id) == ["old 0", "old 1"]
    assert bodies(pool, newer.id) == ["new 0", "new 1", "new 2"]
    assert state(pool, running.id)[:3] == ("completed", None, 2)
    assert state(pool, newer.id)[:3] == ("completed", None, 3)


# --- skipped steps ---------------------------------------------------------------------------------------


def test_a_skipped_last_step_still_completes_the_enrollment(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(
        pool, project.id, MessageStep(text="hi"), MessageStep(text="{{vars.code}}", delay_seconds=3600)
    )
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    assert release(pool, clock).action == "queue"
    clock.advance(HOUR)
    result = release(pool, clock)
    assert (result.action, result.reason) == ("skip", "missing_variable:vars.code")
    assert state(pool, enrollment.id)[:3] == ("completed", None, 2)
    assert step_runs(pool, enrollment.id) == [
        (0, "queued", None),
        (1, "skipped", "missing_variable:vars.code"),
    ]
    assert events(pool) == [
        "message.queued",
        "followup.step_queued",
        "followup.step_skipped",
        "followup.completed",
    ]
    assert release_all(pool, clock) == 0


def test_a_skipped_middle_step_advances_to_the_next_step_on_time(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(
        pool,
        project.id,
        MessageStep(text="a"),
        MessageStep(text="b {{vars.missing}}", delay_seconds=3600),
        MessageStep(text="c", delay_seconds=7200),
    )
    start = clock.now()
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    assert release(pool, clock).action == "queue"
    clock.set(start + HOUR)
    assert release(pool, clock).action == "skip"
    assert state(pool, enrollment.id) == ("active", None, 2, start + 3 * HOUR)
    clock.set(start + 3 * HOUR - timedelta(seconds=1))
    assert release_all(pool, clock) == 0
    clock.set(start + 3 * HOUR)
    assert release(pool, clock).action == "queue"
    assert bodies(pool, enrollment.id) == ["a", "c"]
    assert step_runs(pool, enrollment.id) == [
        (0, "queued", None),
        (1, "skipped", "missing_variable:vars.missing"),
        (2, "queued", None),
    ]
    assert state(pool, enrollment.id)[:3] == ("completed", None, 3)
    assert events(pool) == [
        "message.queued",
        "followup.step_queued",
        "followup.step_skipped",
        "message.queued",
        "followup.step_queued",
        "followup.completed",
    ]


# --- conversation threading ------------------------------------------------------------------------------


def test_messages_thread_into_the_contacts_open_conversation(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"), MessageStep(text="two", delay_seconds=60))
    contact = make_contact(pool, project.id)
    other = make_contact(pool, project.id)
    older = conversation(pool, project.id, contact, status="pending", created_at=clock.now() - DAY)
    newest = conversation(pool, project.id, contact, status="open", created_at=clock.now() - HOUR)
    conversation(pool, project.id, other, status="open", created_at=clock.now())
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    assert release(pool, clock).action == "queue"
    clock.advance(timedelta(seconds=60))
    assert release(pool, clock).action == "queue"

    threaded = rows(
        pool, "SELECT DISTINCT conversation_id FROM messages WHERE followup_enrollment_id = %s", enrollment.id
    )
    assert threaded == [(newest,)]
    assert older != newest
    assert count(pool, "conversations") == 3
    last = rows(
        pool, "SELECT m.body FROM conversations c JOIN messages m ON m.id = c.last_outgoing_message_id"
    )
    assert last == [("two",)]


def test_the_enrollments_own_conversation_is_preferred_while_open(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    own = conversation(pool, project.id, contact, status="open", created_at=clock.now() - DAY)
    conversation(pool, project.id, contact, status="open", created_at=clock.now() - HOUR)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact, conversation_id=own)
    assert release(pool, clock).action == "queue"
    assert rows(
        pool, "SELECT conversation_id FROM messages WHERE followup_enrollment_id = %s", enrollment.id
    ) == [(own,)]


def test_a_resolved_conversation_is_not_reused(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    resolved = conversation(pool, project.id, contact, status="resolved", created_at=clock.now() - HOUR)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact, conversation_id=resolved)
    assert release(pool, clock).action == "queue"
    threaded = rows(
        pool, "SELECT conversation_id FROM messages WHERE followup_enrollment_id = %s", enrollment.id
    )
    assert len(threaded) == 1 and threaded[0][0] != resolved
    opened = rows(
        pool, "SELECT status, contact_id, created_at FROM conversations WHERE id = %s", threaded[0][0]
    )
    assert opened == [("open", contact, clock.now())]
    assert rows(pool, "SELECT status FROM conversations WHERE id = %s", resolved) == [("resolved",)]


@pytest.mark.parametrize("another_open", [False, True])
def test_a_conversation_locked_by_another_transaction_defers_busy_without_waiting(
    pool: ConnectionPool, clock: ManualClock, project: Project, another_open: bool
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    if another_open:
        # an older open conversation must not receive the message just because the newest is busy
        conversation(pool, project.id, contact, status="open", created_at=clock.now() - DAY)
    target = conversation(pool, project.id, contact, status="open", created_at=clock.now() - HOUR)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    metrics = Metrics((STEPS, {"action": "defer", "outcome": "busy"}))

    with locked_conversation(pool, target):
        result = release_without_waiting(pool, clock)
        assert result is not None and (result.action, result.reason) == ("defer", "busy")
    assert state(pool, enrollment.id) == (
        "active",
        None,
        0,
        clock.now() + timedelta(seconds=SETTINGS.busy_retry_seconds),
    )
    assert count(pool, "messages") == 0
    assert count(pool, "followup_step_runs") == 0
    assert count(pool, "activities") == 0
    assert events(pool) == []
    assert metrics.delta(STEPS, action="defer", outcome="busy") == 1

    # once the other transaction is done, the retry threads into that conversation
    assert release_all(pool, clock) == 0
    clock.advance(timedelta(seconds=SETTINGS.busy_retry_seconds))
    assert release(pool, clock).action == "queue"
    assert rows(pool, "SELECT conversation_id FROM messages") == [(target,)]


def test_the_enrollments_conversation_locked_defers_busy_rather_than_threading_elsewhere(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    own = conversation(pool, project.id, contact, status="open", created_at=clock.now() - DAY)
    conversation(pool, project.id, contact, status="open", created_at=clock.now() - HOUR)
    make_enrollment(pool, clock, project.id, seq, contact, conversation_id=own)
    with locked_conversation(pool, own):
        result = release_without_waiting(pool, clock)
        assert result is not None and (result.action, result.reason) == ("defer", "busy")
    assert count(pool, "messages") == 0
    clock.advance(timedelta(seconds=SETTINGS.busy_retry_seconds))
    assert release(pool, clock).action == "queue"
    assert rows(pool, "SELECT conversation_id FROM messages") == [(own,)]


def test_a_locked_contact_defers_busy_without_waiting(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    with pool.connection() as locker:
        # a stop path (inbound message, opt-out) updates the contact
        locker.execute("UPDATE contacts SET name = 'Locked' WHERE id = %s", (contact,))
        result = release_without_waiting(pool, clock)
        assert result is not None and (result.action, result.reason) == ("defer", "busy")
    assert count(pool, "messages") == 0
    assert state(pool, enrollment.id)[:3] == ("active", None, 0)


def test_an_enrollment_counting_a_plan_limit_does_not_block_the_release(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # an enrollment in a plan-limited project holds the project row while it counts live enrollments;
    # the rows a release inserts reference the project, and their foreign key checks must not wait for it
    seq = sequence(pool, project.id, MessageStep(text="one"))
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    with pool.connection() as enrolling:
        enrolling.execute("UPDATE projects SET max_active_enrollments = 100 WHERE id = %s", (project.id,))
    with pool.connection() as enrolling:
        other = make_contact(pool, project.id)
        enroll(enrolling, project.id, EnrollRequest(sequence_id=seq, contact_id=other), now=clock.now())
        result = release_without_waiting(pool, clock)
        assert result is not None and result.action == "queue"
    assert bodies(pool, enrollment.id) == ["one"]


def test_a_plan_change_in_flight_does_not_block_the_release(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    with pool.connection() as other:
        # an ordinary update of the project (not its key) does not conflict with the release
        other.execute("UPDATE projects SET name = 'renamed' WHERE id = %s", (project.id,))
        result = release_without_waiting(pool, clock)
        assert result is not None and result.action == "queue"
    assert bodies(pool, enrollment.id) == ["one"]


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
