"""The release batch's chain (libs.common.followups.release.Chain): each step is a transaction of its own,
its COMMIT sent with the next step's claim, so a batch of N steps costs N + 1 round trips. A step whose
COMMIT fails is found at the next read, wherever it sits in the batch: its failure is recorded (backed off,
nothing of it kept), the claim sent behind it did not run and is made again, and every other step of the
batch is released once and counted once."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.metrics import FOLLOWUP_STEPS, labelled
from libs.common.core.settings import FollowupSettings
from libs.common.followups.release import Chain
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import RoundTrips, rows

SETTINGS = FollowupSettings()

#: Refuses, at COMMIT (a deferred constraint trigger), the step run of the enrollment named in
#: refused_commit.
REFUSE_AT_COMMIT = """
CREATE TABLE refused_commit (enrollment_id uuid PRIMARY KEY);
CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM refused_commit WHERE enrollment_id = NEW.enrollment_id) THEN
        RAISE EXCEPTION 'refused at commit';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON followup_step_runs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit();
"""


def due_enrollments(
    pool: ConnectionPool, clock: ManualClock, project: Project, count: int
) -> list[uuid.UUID]:
    """``count`` enrollments in a one-step sequence, due one second apart (claimed in that order)."""
    sequence = make_sequence(pool, project.id)
    ids = []
    for _ in range(count):
        ids.append(make_enrollment(pool, clock, project.id, sequence, make_contact(pool, project.id)).id)
        clock.advance(timedelta(seconds=1))
    return ids


def released(pool: ConnectionPool) -> dict[uuid.UUID, tuple[str, int]]:
    return {
        enrollment: (status, failures)
        for enrollment, status, failures in rows(
            pool, "SELECT id, status, failure_count FROM followup_enrollments"
        )
    }


def test_a_batch_of_steps_costs_one_round_trip_a_step_and_one_more(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    due_enrollments(pool, clock, project, 4)
    with pool.connection() as conn:  # each contact's conversation open (no step opens one: no read of it)
        conn.execute(
            "INSERT INTO conversations (project_id, contact_id) SELECT project_id, id FROM contacts"
            " WHERE project_id = %s",
            (project.id,),
        )
    with pool.connection() as conn, RoundTrips(conn) as trips, Chain(conn, clock, SETTINGS, None) as chain:
        outcomes = [chain.release(project.id) for _ in range(4)]
    assert trips.count == 5
    assert [o.action if o else None for o in outcomes] == ["queue"] * 4
    assert [r.action for r in chain.take_committed()] == ["queue"] * 4
    assert set(released(pool).values()) == {("completed", 0)}
    assert rows(pool, "SELECT count(*) FROM messages") == [(4,)]


@pytest.mark.parametrize("refused", [0, 2, 4], ids=["first", "middle", "last"])
def test_a_step_whose_commit_fails_is_backed_off_and_every_other_step_is_released_once(
    pool: ConnectionPool, clock: ManualClock, project: Project, refused: int
) -> None:
    ids = due_enrollments(pool, clock, project, 5)
    with pool.connection() as conn:
        conn.execute(REFUSE_AT_COMMIT)
        conn.execute("INSERT INTO refused_commit VALUES (%s)", (ids[refused],))
    queued_before = labelled(FOLLOWUP_STEPS, "queue", "sent")._value.get()
    retried_before = labelled(FOLLOWUP_STEPS, "retry", "error")._value.get()

    assert release_batch(pool, clock, SETTINGS, limit=100) == 5

    state = released(pool)
    assert state.pop(ids[refused]) == ("active", 1)  # its failure counted: backed off, not released
    assert set(state.values()) == {("completed", 0)}
    (error,) = rows(pool, "SELECT last_error FROM followup_enrollments WHERE id = %s", ids[refused])
    assert error[0].startswith("RaiseException: refused at commit"), error
    # nothing of the refused step is kept, and each other step was written once
    assert rows(pool, "SELECT count(*) FROM followup_step_runs WHERE enrollment_id = %s", ids[refused]) == [
        (0,)
    ]
    assert rows(pool, "SELECT count(*), count(DISTINCT followup_enrollment_id) FROM messages") == [(4, 4)]
    # counted once each, once committed (or once the failure was recorded)
    assert labelled(FOLLOWUP_STEPS, "queue", "sent")._value.get() - queued_before == 4
    assert labelled(FOLLOWUP_STEPS, "retry", "error")._value.get() - retried_before == 1
    # backed off: not due again before its back-off
    assert release_batch(pool, clock, SETTINGS, limit=100) == 0


def test_a_chain_whose_connection_is_cut_before_its_last_commit_counts_no_failure_against_the_step(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    (enrollment,) = due_enrollments(pool, clock, project, 1)
    clock.advance(timedelta(seconds=1))
    with pool.connection() as conn:
        pid = conn.info.backend_pid
        with pytest.raises(psycopg.OperationalError), Chain(conn, clock, SETTINGS, None) as chain:
            assert chain.release(project.id) is not None  # its COMMIT queued, not sent yet
            with pool.connection() as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert conn.closed  # the pool drops it
        assert chain.take_committed() == []  # nothing counted
    # the step's transaction died with the connection: nothing of it kept, no failure counted, due again
    assert released(pool) == {enrollment: ("active", 0)}
    assert rows(pool, "SELECT count(*) FROM messages") == [(0,)]
    assert release_batch(pool, clock, SETTINGS, limit=10) == 1
    assert released(pool) == {enrollment: ("completed", 0)}


def test_steps_committed_before_a_chain_fails_are_counted_in_the_metrics(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    due_enrollments(pool, clock, project, 2)
    clock.advance(timedelta(seconds=1))
    queued_before = labelled(FOLLOWUP_STEPS, "queue", "sent")._value.get()
    with pool.connection() as conn:
        pid = conn.info.backend_pid
        with pytest.raises(psycopg.OperationalError), Chain(conn, clock, SETTINGS, None) as chain:
            assert chain.release(project.id) is not None
            assert chain.release(project.id) is not None  # the first step's COMMIT read back with this claim
            assert labelled(FOLLOWUP_STEPS, "queue", "sent")._value.get() == queued_before  # not yet added
            with pool.connection() as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        (committed,) = chain.take_committed()
        assert committed.action == "queue"
    # the chain's tally reached the metrics though it ended in an error: the committed step only
    assert labelled(FOLLOWUP_STEPS, "queue", "sent")._value.get() - queued_before == 1
