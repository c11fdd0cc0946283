"""The release step's own behaviour on the controllable clock: nothing due, when the next step falls due,
each step released once at its time, an opted-out contact stopped, a locked contact retried soon, a poison
row backing off then failing, a database cut that is not the enrollment's failure, concurrent batches."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.settings import FollowupSettings
from libs.common.followups import release_step
from libs.common.followups.definition import MessageStep
from libs.common.followups.release_step import backoff
from services.release.release import release_batch, release_one, seconds_until_next_due
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows

SETTINGS = FollowupSettings(max_failures=3)


def test_nothing_due_releases_nothing(pool: ConnectionPool, clock: ManualClock, project: Project) -> None:
    sequence = make_sequence(pool, project.id, MessageStep(text="later", delay_seconds=3600))
    make_enrollment(pool, clock, project.id, sequence, make_contact(pool, project.id))
    assert release_one(pool, clock, SETTINGS) is None


def test_the_loop_knows_when_the_next_step_falls_due(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given nothing waiting, the release loop knows of nothing to wake for
    assert seconds_until_next_due(pool, clock) is None
    # When a contact is enrolled with a first step in 90 s and another with one in 40 s
    for delay in (90, 40):
        sequence = make_sequence(pool, project.id, MessageStep(text="hi", delay_seconds=delay))
        make_enrollment(pool, clock, project.id, sequence, make_contact(pool, project.id))
    # Then the loop would sleep 40 s; and once that one is released, until the other (50 s later)
    assert seconds_until_next_due(pool, clock) == pytest.approx(40)
    clock.advance(timedelta(seconds=40))
    assert seconds_until_next_due(pool, clock) == pytest.approx(50)  # a due row is not a next due time
    assert release_batch(pool, clock, FollowupSettings()) == 1
    assert seconds_until_next_due(pool, clock) == pytest.approx(50)


def test_a_two_step_sequence_releases_each_step_once_at_its_time(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given a sequence: now, then one day later
    sequence = make_sequence(
        pool, project.id, MessageStep(text="first"), MessageStep(text="second", delay_seconds=86400)
    )
    enrollment = make_enrollment(pool, clock, project.id, sequence, make_contact(pool, project.id))

    # When the first step is released
    first = release_one(pool, clock, SETTINGS)
    assert first is not None and first.action == "queue"
    # Then the second is not due yet, a minute or a day minus a second later
    assert release_one(pool, clock, SETTINGS) is None
    clock.advance(timedelta(seconds=86399))
    assert release_one(pool, clock, SETTINGS) is None
    clock.advance(timedelta(seconds=1))
    second = release_one(pool, clock, SETTINGS)
    assert second is not None and second.action == "queue"
    assert release_one(pool, clock, SETTINGS) is None

    messages = rows(
        pool,
        "SELECT body, status, followup_step_index FROM messages WHERE followup_enrollment_id = %s"
        " ORDER BY followup_step_index",
        enrollment.id,
    )
    assert messages == [("first", "QUEUED", 0), ("second", "QUEUED", 1)]
    assert rows(pool, "SELECT status FROM followup_enrollments WHERE id = %s", enrollment.id) == [
        ("completed",)
    ]
    events = rows(pool, "SELECT type FROM outbox ORDER BY id")
    assert [e[0] for e in events] == [
        "message.queued",
        "followup.step_queued",
        "message.queued",
        "followup.step_queued",
        "followup.completed",
    ]
    # both messages thread into the same (new) conversation
    assert rows(pool, "SELECT count(DISTINCT conversation_id) FROM messages")[0][0] == 1


def test_an_opted_out_contact_is_stopped_not_messaged(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    sequence = make_sequence(pool, project.id)
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, sequence, contact)
    with pool.connection() as conn:
        conn.execute("UPDATE contacts SET opted_out_at = now() WHERE id = %s", (contact,))
    result = release_one(pool, clock, SETTINGS)
    assert result is not None and (result.action, result.reason) == ("stop", "opted_out")
    assert rows(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment.id) == [
        ("stopped", "opted_out")
    ]
    assert rows(pool, "SELECT count(*) FROM messages") == [(0,)]


def test_a_locked_contact_is_retried_soon_without_waiting(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    sequence = make_sequence(pool, project.id)
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, sequence, contact)
    with pool.connection() as locker:
        # a stop path holds the contact
        locker.execute("SELECT 1 FROM contacts WHERE id = %s FOR UPDATE", (contact,))
        result = release_one(pool, clock, SETTINGS)
        assert result is not None and (result.action, result.reason) == ("defer", "busy")
    due = rows(pool, "SELECT next_run_at FROM followup_enrollments WHERE id = %s", enrollment.id)[0][0]
    assert due == clock.now() + timedelta(seconds=SETTINGS.busy_retry_seconds)
    assert rows(pool, "SELECT count(*) FROM messages") == [(0,)]


def test_a_poison_row_backs_off_exponentially_then_fails(
    pool: ConnectionPool, clock: ManualClock, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    sequence = make_sequence(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, sequence, make_contact(pool, project.id))

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(release_step, "message_to_queue", explode)
    delays = []
    for _ in range(SETTINGS.max_failures - 1):
        started = clock.now()
        result = release_one(pool, clock, SETTINGS)
        assert result is not None and result.action == "retry"
        # not due again until the backoff has passed: no hot loop
        assert release_one(pool, clock, SETTINGS) is None
        due = rows(pool, "SELECT next_run_at FROM followup_enrollments WHERE id = %s", enrollment.id)[0][0]
        delays.append(due - started)
        clock.set(due)
    assert delays == [timedelta(seconds=30), timedelta(seconds=60)]
    result = release_one(pool, clock, SETTINGS)
    assert result is not None and result.action == "fail"
    status = rows(pool, "SELECT status, reason, failure_count, last_error FROM followup_enrollments")
    assert status == [("failed", "error", 3, "RuntimeError: injected failure")]
    # the failed attempts left nothing behind: every transaction rolled back
    assert rows(pool, "SELECT count(*) FROM messages") == [(0,)]
    assert rows(pool, "SELECT count(*) FROM followup_step_runs") == [(0,)]
    assert release_one(pool, clock, SETTINGS) is None


@pytest.mark.parametrize(
    "lost",
    [
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    ],
)
def test_a_release_the_database_cut_is_not_the_enrollments_failure(
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    monkeypatch: pytest.MonkeyPatch,
    lost: Exception,
) -> None:
    # Given a due enrollment whose release loses the database connection half-way
    sequence = make_sequence(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, sequence, make_contact(pool, project.id))

    def cut(*args: Any, **kwargs: Any) -> Any:
        raise lost

    monkeypatch.setattr(release_step, "message_to_queue", cut)
    # When it is released, the error goes up to the loop (which backs off as a whole)
    with pytest.raises(type(lost)):
        release_one(pool, clock, SETTINGS)
    # Then no failure is counted and no back-off set: once the server is back it goes out at once
    state = rows(pool, "SELECT status, failure_count, last_error, next_run_at FROM followup_enrollments")
    assert state == [("active", 0, None, enrollment.next_run_at)]
    monkeypatch.undo()
    result = release_one(pool, clock, SETTINGS)
    assert result is not None and result.action == "queue"


def test_backoff_doubles_from_30_seconds_and_caps_at_an_hour() -> None:
    settings = FollowupSettings()
    assert [backoff(n, settings).total_seconds() for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert backoff(20, settings) == timedelta(hours=1)


def test_concurrent_release_batches_never_send_a_step_twice(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    sequence = make_sequence(pool, project.id)
    for _ in range(60):
        make_enrollment(pool, clock, project.id, sequence, make_contact(pool, project.id))
    counts: list[int] = []
    threads = [
        threading.Thread(target=lambda: counts.append(release_batch(pool, clock, SETTINGS, limit=1000)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == 60
    assert rows(pool, "SELECT count(*), count(DISTINCT followup_enrollment_id) FROM messages") == [(60, 60)]


def test_a_step_that_already_ran_is_never_sent_again_and_its_move_and_events_roll_back(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given a due enrollment whose step already has its run (as if a release had sent it)
    sequence = make_sequence(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, sequence, make_contact(pool, project.id))
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, due_at, ran_at)"
            " VALUES (%s, 0, %s, 'queued', %s, %s)",
            (enrollment.id, project.id, clock.now(), clock.now()),
        )

    # When the release reaches it
    result = release_one(pool, clock, SETTINGS)

    # Then the step run's key refuses the statement that writes the run with the move and the events: the
    # whole step rolls back (no message, no event, the enrollment still at its step) and is retried later
    assert result is not None and result.action == "retry", result
    assert result.reason is not None and "followup_step_runs_pkey" in result.reason
    assert rows(pool, "SELECT count(*) FROM messages") == [(0,)]
    assert rows(pool, "SELECT count(*) FROM outbox WHERE aggregate_id = %s", enrollment.id) == [(0,)]
    assert rows(pool, "SELECT status, step_index FROM followup_enrollments") == [("active", 0)]
    assert rows(pool, "SELECT count(*) FROM followup_step_runs") == [(1,)]
