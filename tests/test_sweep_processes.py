"""The sweep of delayed rules, several at once: every due execution runs exactly once.

1. Three ``followups worker triggers`` processes sweep 20,000 due executions (each writes one private note:
   the witness); one is killed (SIGKILL) in the middle of a batch and a replacement started. The killed
   worker's row in flight rolls back, the rows it had leased wait for the lease, then run once.
2. Three sweeps in threads of one process on the same 300 due executions of a ``send_message`` rule: one
   message (and one ``message.queued`` event) per execution, recorded with its status change.
3. The lease, step by step (in-process, on a manual clock): a sweeper that claimed a batch and stalled
   keeps it from the others until the lease runs out; then another takes the rows over, except the one the
   stalled sweeper still holds locked; when the stalled sweeper resumes, it finishes that row and runs none
   of those taken over, whether the new holder has run them yet or not.

The lease (``LEASE`` in :mod:`libs.common.rules.executions`, 2 minutes) is a constant, not a setting: the
tests move a lease's end back instead of waiting for it.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from benchmarks.sweep import seed_executions, seed_project_and_rule
from libs.common.core.clock import SYSTEM_CLOCK, ManualClock
from libs.common.core.jobs import RoundRobin, claim_in_turns
from libs.common.rules import executions
from libs.common.rules.executions import LEASE, QUERIES, Swept, sweep
from libs.common.rules.trace import Recorded
from tests.helpers import Process, rows, start_worker, stop_all, wait_until

EXECUTIONS = 20_000
WORKERS = 3
STALE_AFTER = timedelta(days=1)
#: A rule's re-check that holds (a tree without conditions).
HOLDS = Recorded(conditions={"all": []}, results=[True], actuals=[])


def _rows_of(db_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


def _count(db_url: str, query: str, *params: Any) -> int:
    [(count,)] = _rows_of(db_url, query, *params)
    return int(count)


def _deadlocks(db_url: str) -> int:
    return _count(db_url, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")


def _last_lease(worker: Process) -> datetime | None:
    """The lease of the batch the worker last logged a row of (each row's log line carries it)."""
    for line in reversed(worker.lines):
        if "delayed rule executed" in line:
            return datetime.fromisoformat(json.loads(line)["lease_until"])
    return None


def _stop_mid_batch(worker: Process, db_url: str) -> tuple[datetime, set[uuid.UUID]]:
    """Freeze the worker (SIGSTOP) while it is in the middle of a batch: the end of the batch's lease and the
    rows it still holds (pending, leased to it; the one in flight among them).

    A batch's rows share their lease's end, which each row's log line carries: the last line the worker
    wrote gives its batch's lease. Frozen between two batches (or before it logged the first row of the
    next), it holds none of that lease: go on a bit and try again."""
    for _ in range(100):
        worker.send(signal.SIGSTOP)
        time.sleep(0.3)  # the reader thread takes in the last lines it wrote
        until = _last_lease(worker)
        if until is not None:
            query = "SELECT id FROM rule_pending_executions WHERE status = 'pending' AND locked_until = %s"
            held = {i for (i,) in _rows_of(db_url, query, until)}
            if held:
                return until, held
        worker.send(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the worker was never caught in the middle of a batch")


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_workers_and_one_killed_mid_batch_execute_every_due_row_exactly_once(
    db_url: str, amqp_url: str
) -> None:
    # Given 20,000 executions of a delayed rule already due, one contact each (the rule adds a note)
    now = datetime.now(UTC)
    with psycopg.connect(db_url) as conn:
        project_id, rule_id = seed_project_and_rule(conn, now=now)
        seed_executions(conn, project_id, rule_id, EXECUTIONS, first_due=now - timedelta(minutes=1), now=now)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    deadlocks_before = _deadlocks(db_url)
    executed = "SELECT count(*) FROM rule_pending_executions WHERE status = 'executed'"
    notes = "SELECT count(*) FROM activities WHERE kind = 'private_note'"

    # When three triggers workers sweep them side by side
    env = {"DATABASE_URL": db_url, "AMQP_URL": amqp_url, "WORKER_THREADS": "1"}
    workers = [start_worker("triggers", env) for _ in range(WORKERS)]
    victim, running = workers[0], workers[1:]
    try:
        wait_until(lambda: _count(db_url, executed) >= 3000, timeout=60, interval=0.05, what="3,000 executed")
        # and one of them is killed in the middle of a batch, and a replacement started
        until, held = _stop_mid_batch(victim, db_url)
        victim.send(signal.SIGKILL)
        assert victim.wait_exit() == -signal.SIGKILL
        running.append(start_worker("triggers", env))

        # Then the others run every row but those the killed worker held, which wait for its lease
        def only_held_left() -> bool:
            query = "SELECT id FROM rule_pending_executions WHERE status = 'pending'"
            return {i for (i,) in _rows_of(db_url, query)} == held

        wait_until(only_held_left, timeout=90, interval=0.1, what="every row but the held ones executed")
        still_leased = "SELECT count(*) FROM rule_pending_executions WHERE id = ANY(%s) AND locked_until = %s"
        assert _count(db_url, still_leased, list(held), until) == len(held)
        # the row it was running rolled back: no note of a held row
        assert _count(db_url, notes) == EXECUTIONS - len(held)

        # When the lease runs out (moved back by LEASE instead of waiting for it)
        with psycopg.connect(db_url) as conn:
            conn.execute(
                "UPDATE rule_pending_executions SET locked_until = locked_until - %s"
                " WHERE id = ANY(%s) AND status = 'pending'",
                (LEASE, list(held)),
            )
        # Then the rows it held are taken over and run too
        wait_until(
            lambda: _count(db_url, executed) == EXECUTIONS,
            timeout=30,
            interval=0.1,
            what="every row executed",
        )
    finally:
        victim.send(signal.SIGKILL)
        victim.popen.wait()
        codes = stop_all(running)
    # the workers left running stop cleanly
    assert codes == [0] * WORKERS, "\n".join(w.output for w in running)

    with psycopg.connect(db_url) as conn:
        statuses = conn.execute("SELECT status, count(*) FROM rule_pending_executions GROUP BY 1").fetchall()
        counts = conn.execute(
            "SELECT count(*), count(DISTINCT contact_id) FROM activities WHERE kind = 'private_note'"
        ).fetchone()
        not_once = conn.execute(
            """
            SELECT count(*) FROM rule_pending_executions e
            WHERE (SELECT count(*) FROM activities a
                   WHERE a.kind = 'private_note' AND a.contact_id = e.contact_id) <> 1
            """
        ).fetchone()
    # every row executed, none skipped or left pending; exactly one note per execution
    assert statuses == [("executed", EXECUTIONS)]
    assert counts == (EXECUTIONS, EXECUTIONS)
    assert not_once == (0,)
    assert _deadlocks(db_url) == deadlocks_before
    # every worker took part, the replacement too
    for worker in [victim, *running]:
        assert any("delayed rule executed" in line for line in worker.lines), worker.output


def test_three_sweepers_queue_each_delayed_message_exactly_once_with_its_status_change(
    pool: ConnectionPool,
) -> None:
    # Given 300 due executions of a delayed rule that sends a message, one contact each
    now = datetime.now(UTC)
    with pool.connection() as conn:
        project_id, rule_id = seed_project_and_rule(
            conn, now=now, actions=[{"type": "send_message", "text": "Hello {{contact.name}}"}]
        )
        seed_executions(conn, project_id, rule_id, 300, first_due=now - timedelta(minutes=1), now=now)

    # When three sweepers sweep them at once, in small batches
    start = threading.Barrier(3)
    results: list[list[Swept]] = [[] for _ in range(3)]
    errors: list[BaseException] = []

    def sweeper(mine: list[Swept]) -> None:
        try:
            start.wait()
            while True:
                swept = sweep(pool, SYSTEM_CLOCK, stale_after=STALE_AFTER, limit=20)
                if not swept.claimed:
                    return
                mine.append(swept)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sweeper, args=(mine,)) for mine in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors

    # Then each row was claimed once and queued one message, whose id it records
    swept = [s for mine in results for s in mine]
    assert sum(s.claimed for s in swept) == 300
    reported = [m for s in swept for m in s.done.message_ids]
    assert len(reported) == len(set(reported)) == 300
    assert rows(pool, "SELECT status, count(*) FROM rule_pending_executions GROUP BY 1") == [
        ("executed", 300)
    ]
    assert rows(pool, "SELECT count(*), count(DISTINCT contact_id) FROM messages WHERE source = 'rule'") == [
        (300, 300)
    ]
    matched = rows(
        pool,
        """
        SELECT count(*) FROM rule_pending_executions e
        JOIN messages m ON m.id = e.message_id AND m.contact_id = e.contact_id
        WHERE m.source = 'rule' AND m.status = 'QUEUED'
        """,
    )
    assert matched == [(300,)]
    assert {m for (m,) in rows(pool, "SELECT message_id FROM rule_pending_executions")} == set(reported)
    # and one message.queued event per message
    events = rows(
        pool,
        """
        SELECT count(*), count(DISTINCT o.aggregate_id) FROM outbox o
        JOIN messages m ON m.id = o.aggregate_id
        WHERE o.type = 'message.queued'
        """,
    )
    assert events == [(300, 300)]


def test_a_lease_that_ran_out_is_taken_over_but_never_run_twice(
    pool: ConnectionPool, clock: ManualClock
) -> None:
    # Given 10 due executions (a note each)
    start = clock.now()
    with pool.connection() as conn:
        project_id, rule_id = seed_project_and_rule(conn, now=start)
        seed_executions(conn, project_id, rule_id, 10, first_due=start - timedelta(minutes=1), now=start)
    notes = "SELECT count(*), count(DISTINCT contact_id) FROM activities WHERE kind = 'private_note'"

    # When sweeper A claims them all and stalls: it is running the first, holding its row lock
    until_a = start + LEASE
    with pool.connection() as conn:
        params = {"now": start, "until": until_a} | RoundRobin().params(100)
        claimed = [
            row[0]
            for row in claim_in_turns(conn, QUERIES["due_shares"], QUERIES["claim_due"], params, tuple_row)
        ]
    assert len(claimed) == 10
    first, rest = claimed[0], claimed[1:]
    swept_a = Swept()
    with pool.connection() as conn_a:
        lease = {"project_id": project_id, "id": first, "until": until_a}
        assert conn_a.execute(QUERIES["lock_leased"], lease).fetchone() is not None

        # Then until the lease runs out, no other sweep takes any of them
        clock.set(start + LEASE - timedelta(seconds=1))
        assert sweep(pool, clock, stale_after=STALE_AFTER).claimed == 0

        # When it has run out, sweeper B takes over the rows, but for the one A holds locked
        clock.set(start + LEASE + timedelta(seconds=1))
        swept_b = sweep(pool, clock, stale_after=STALE_AFTER)
        assert swept_b.claimed == 9
        assert swept_b.outcomes == {("executed", "none"): 9}

        # and A resumes: it finishes the row it holds
        executions._execute(conn_a, lease, until_a, HOLDS, STALE_AFTER, swept_a, start)
    # and runs none of the rows taken over
    for execution_id in rest:
        with pool.connection() as conn_a:
            execution = {"project_id": project_id, "id": execution_id}
            executions._execute(conn_a, execution, until_a, HOLDS, STALE_AFTER, swept_a, start)
    assert swept_a.outcomes == {("executed", "none"): 1}
    assert sweep(pool, clock, stale_after=STALE_AFTER).claimed == 0

    # Then every row ran exactly once
    assert rows(pool, "SELECT status, count(*) FROM rule_pending_executions GROUP BY 1") == [("executed", 10)]
    assert rows(pool, notes) == [(10, 10)]


def test_a_row_taken_over_after_the_lease_is_run_by_the_new_holder_only(
    pool: ConnectionPool, clock: ManualClock
) -> None:
    # Given a due execution claimed by sweeper A, whose lease ran out, then claimed by sweeper B
    start = clock.now()
    with pool.connection() as conn:
        project_id, rule_id = seed_project_and_rule(conn, now=start)
        seed_executions(conn, project_id, rule_id, 1, first_due=start - timedelta(minutes=1), now=start)
    later = start + LEASE + timedelta(seconds=1)
    leases = []
    for now in (start, later):
        with pool.connection() as conn:
            params = {"now": now, "until": now + LEASE} | RoundRobin().params(100)
            claimed = claim_in_turns(conn, QUERIES["due_shares"], QUERIES["claim_due"], params, tuple_row)
            leases.append((now, [row[0] for row in claimed]))
    (_, [id_a]), (_, [id_b]) = leases
    assert id_a == id_b
    execution = {"project_id": project_id, "id": id_a}

    # When A runs it with its lease, nothing happens; when B does, it runs
    swept_a, swept_b = Swept(), Swept()
    with pool.connection() as conn:
        executions._execute(conn, execution, start + LEASE, HOLDS, STALE_AFTER, swept_a, start)
    with pool.connection() as conn:
        executions._execute(conn, execution, later + LEASE, HOLDS, STALE_AFTER, swept_b, later)
    # and A again, after B: still nothing
    with pool.connection() as conn:
        executions._execute(conn, execution, start + LEASE, HOLDS, STALE_AFTER, swept_a, start)

    # Then it ran once, by B
    assert swept_a.outcomes == {}
    assert swept_b.outcomes == {("executed", "none"): 1}
    assert rows(pool, "SELECT count(*) FROM activities WHERE kind = 'private_note'") == [(1,)]
