"""A bulk enrollment job moved on by worker processes, one of them killed in the middle: every contact is
enrolled exactly once.

Two ``followups worker triggers`` processes share a job of 20,000 contacts (one chunk per transaction,
under the job row's lock: one worker at a time moves it on, the other finds it locked and waits). When some
thousands are enrolled, the worker holding the job is frozen in the middle of a chunk (its transaction
open, the job row locked), then killed (SIGKILL): its chunk rolls back. A replacement is started; the
workers carry the job to its end. Then: one enrollment per contact, the job's counts add up, every item has
its outcome, and the workers left stop cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from libs.common.followups.definition import Definition, MessageStep
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.platform.projects import create_project
from libs.common.rules import bulk
from libs.common.rules.bulk import BulkCreate
from tests.helpers import Process, start_worker, stop_all, wait_until

CONTACTS = 20_000
WORKERS = 2
#: Enrolled (committed) before the kill.
KILL_AFTER = 4_000


def _rows(db_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


def _one(db_url: str, query: str, *params: Any) -> Any:
    [row] = _rows(db_url, query, *params)
    return row[0] if len(row) == 1 else row


def seed(db_url: str, count: int) -> tuple[uuid.UUID, uuid.UUID, list[uuid.UUID]]:
    """A project, a published one-step sequence (its message a day after enrollment, so nothing is due)
    and ``count`` contacts inserted in one statement: (project_id, sequence_id, contact ids)."""
    now = datetime.now(UTC)
    with psycopg.connect(db_url) as conn:
        project_id = create_project(conn, "bulk processes").project_id
        sequence = create_sequence(
            conn,
            project_id,
            SequenceCreate(
                name="bulk", definition=Definition(steps=[MessageStep(text="Hello", delay_seconds=86_400)])
            ),
        )
        publish_sequence(conn, project_id, sequence.id)
        contact_ids = [
            row[0]
            for row in conn.execute(
                """
                INSERT INTO contacts (id, project_id, phone, name, created_at, updated_at)
                SELECT gen_random_uuid(), %(project_id)s, '+1' || lpad((5000000000 + g)::text, 10, '0'),
                       'Contact ' || g, %(now)s, %(now)s
                FROM generate_series(1, %(count)s) AS g
                ORDER BY g
                RETURNING id
                """,
                {"project_id": project_id, "count": count, "now": now},
            )
        ]
    return project_id, sequence.id, contact_ids


def _chunks_logged(worker: Process) -> list[dict[str, Any]]:
    """The chunks the worker logged (committed or about to be), in order."""
    found = []
    for line in list(worker.lines):
        if '"bulk job chunk"' in line or '"bulk job completed"' in line:
            found.append(json.loads(line))
    return found


def _holder_frozen_mid_chunk(db_url: str) -> bool:
    """Whether a transaction holding the job's row lock has been idle for a while: its worker is frozen
    in the middle of a chunk (a worker that runs never leaves its chunk's transaction idle that long)."""
    held = _one(
        db_url,
        """
        SELECT count(*) FROM pg_locks l
        JOIN pg_class c ON c.oid = l.relation
        JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE c.relname = 'followup_bulk_jobs' AND l.mode = 'RowShareLock' AND l.granted
          AND a.state = 'idle in transaction' AND a.state_change < clock_timestamp() - interval '300 ms'
        """,
    )
    return bool(held)


def _freeze_mid_chunk(workers: list[Process], db_url: str) -> Process:
    """Freeze (SIGSTOP) the worker that holds the job, in the middle of a chunk; returns it.

    The worker that logged a chunk last is the likely holder: frozen, it must be seen holding the job's
    row lock in an idle transaction; if it was between two chunks (the other worker took the job on), it
    is let go and the other tried."""
    for _ in range(200):
        latest = max(
            (w for w in workers if _chunks_logged(w)),
            key=lambda w: _chunks_logged(w)[-1]["time"],
            default=None,
        )
        candidate = latest or workers[0]
        candidate.send(signal.SIGSTOP)
        time.sleep(0.5)
        if _holder_frozen_mid_chunk(db_url):
            return candidate
        candidate.send(signal.SIGCONT)
        time.sleep(0.1)
    raise AssertionError("no worker was caught holding the job in the middle of a chunk")


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_workers_and_one_killed_mid_chunk_enroll_every_contact_exactly_once(
    db_url: str, amqp_url: str
) -> None:
    # Given a job of 20,000 contacts
    project_id, sequence_id, contact_ids = seed(db_url, CONTACTS)
    with psycopg.connect(db_url) as conn:
        job, created = bulk.create_job(
            conn,
            project_id,
            BulkCreate(sequence_id=sequence_id, contact_ids=contact_ids),
            now=datetime.now(UTC),
        )
    assert created and job.total == CONTACTS
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE")

    def job_row() -> tuple[str, int, int, int, dict[str, int]]:
        found: tuple[str, int, int, int, dict[str, int]] = _one(
            db_url,
            "SELECT status, total, processed, enrolled, skipped FROM followup_bulk_jobs WHERE id = %s",
            job.id,
        )
        return found

    # When two triggers workers process it (polling often, so the one left takes the job on quickly)
    env = {
        "DATABASE_URL": db_url,
        "AMQP_URL": amqp_url,
        "WORKER_THREADS": "1",
        "WORKER_POLL_INTERVAL_SECONDS": "0.05",
        "WORKER_IDLE_MAX_SLEEP_SECONDS": "0.5",
    }
    workers = [start_worker("triggers", env) for _ in range(WORKERS)]
    running = list(workers)
    victim: Process | None = None
    try:
        wait_until(
            lambda: job_row()[3] >= KILL_AFTER, timeout=120, interval=0.05, what=f"{KILL_AFTER} enrolled"
        )
        # and the worker holding it is killed in the middle of a chunk
        victim = _freeze_mid_chunk(workers, db_url)
        running.remove(victim)
        status, _, processed_at_kill, enrolled_at_kill, _ = job_row()
        assert status == "running" and KILL_AFTER <= enrolled_at_kill < CONTACTS
        victim.send(signal.SIGKILL)
        assert victim.wait_exit() == -signal.SIGKILL
        # its chunk rolled back: the job's lock is free again, nothing of the chunk was kept
        wait_until(
            lambda: not _holder_frozen_mid_chunk(db_url), timeout=30, what="the killed chunk rolled back"
        )
        # and a replacement is started
        running.append(start_worker("triggers", env))
        # (up before the job may end: a worker stopped while it starts has no handler for SIGTERM yet)
        running[-1].wait_for("services started")

        # Then the workers left carry the job to its end
        wait_until(lambda: job_row()[0] == "completed", timeout=180, interval=0.2, what="the job completed")
    finally:
        if victim is not None:
            victim.send(signal.SIGKILL)
            victim.popen.wait()
        codes = stop_all(running)
    # and stop cleanly on SIGTERM
    assert codes == [0] * len(running), "\n".join(w.output for w in running)

    # Then every contact is enrolled exactly once, and the job's counts add up
    assert job_row() == ("completed", CONTACTS, CONTACTS, CONTACTS, {})
    assert _one(db_url, "SELECT count(*) FROM followup_enrollments") == CONTACTS
    assert _one(db_url, "SELECT count(DISTINCT contact_id) FROM followup_enrollments") == CONTACTS
    not_once = _one(
        db_url,
        """
        SELECT count(*) FROM followup_bulk_job_items i
        WHERE i.job_id = %s
          AND (SELECT count(*) FROM followup_enrollments e WHERE e.contact_id = i.contact_id) <> 1
        """,
        job.id,
    )
    assert not_once == 0
    assert (
        _one(
            db_url,
            "SELECT count(*) FROM followup_enrollments WHERE source = 'bulk' AND sequence_id = %s",
            sequence_id,
        )
        == CONTACTS
    )
    # every item has its outcome
    with psycopg.connect(db_url) as conn:
        outcomes = Counter(o for *_, o, _ in bulk.item_outcomes(conn, project_id, job.id))
    assert outcomes == {"enrolled": CONTACTS}
    # one completed event, with the counts
    completed = _rows(
        db_url, "SELECT data FROM outbox WHERE type = 'bulk_job.completed' AND aggregate_id = %s", job.id
    )
    assert [(e["status"], e["processed"], e["enrolled"]) for (e,) in completed] == [
        ("completed", CONTACTS, CONTACTS)
    ]
    # the job was moved on after the kill by the workers left (the killed one had not got that far)
    assert victim is not None
    assert processed_at_kill < CONTACTS
    after_kill = [c for w in running for c in _chunks_logged(w) if c["processed"] > processed_at_kill]
    assert after_kill, "\n".join(w.output for w in running)
