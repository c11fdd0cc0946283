"""A sequence's enrollments step after step at release: a sequence over days, a paused sequence (and
a manually paused enrollment), a running enrollment pinned to its version, skipped steps completing or
advancing the enrollment.

Domain-level scenarios of the release path (seed 000, "Release (one step, one transaction)"), driven on
the controllable clock: what each release leaves behind in messages, step runs, the enrollment, the outbox
and the metrics.
"""

from __future__ import annotations

from datetime import timedelta

from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.followups.definition import Definition, MessageStep
from libs.common.followups.sequences import (
    SequenceUpdate,
    change_sequence_status,
    publish_sequence,
    update_sequence,
)
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment
from tests.helpers import rows
from tests.release_helpers import (
    DAY,
    FINISHED,
    HOUR,
    STEPS,
    Metrics,
    bodies,
    count,
    events,
    messages,
    release,
    release_all,
    sequence,
    state,
    step_runs,
)

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
