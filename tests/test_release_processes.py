"""Several release worker processes side by side: every step exactly once, no deadlock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from benchmarks.seed import seed_due_enrollments, seed_project
from tests.helpers import start_worker, stop_all, wait_until

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

ENROLLMENTS = 2000
WORKERS = 4


def test_four_release_workers_queue_each_step_exactly_once(db_url: str, amqp_url: str) -> None:
    # Given 2,000 due enrollments
    with psycopg.connect(db_url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(
            conn, project_id, sequence_id, ENROLLMENTS, due_at=datetime.now(UTC) - timedelta(seconds=1)
        )
        deadlocks_before = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    # When four release worker processes run side by side
    env = {"DATABASE_URL": db_url, "AMQP_URL": amqp_url, "WORKER_THREADS": "1"}
    workers = [start_worker("release", env) for _ in range(WORKERS)]

    def all_released() -> bool:
        with psycopg.connect(db_url) as conn:
            query = "SELECT count(*) FROM followup_enrollments WHERE status = 'active'"
            return conn.execute(query).fetchone() == (0,)

    try:
        wait_until(all_released, timeout=120, interval=0.1, what="every enrollment released")
    finally:
        codes = stop_all(workers)
    assert codes == [0] * WORKERS, "\n".join(w.output for w in workers)
    # Then every enrollment completed with exactly one message, and nothing deadlocked
    with psycopg.connect(db_url) as conn:
        counts = conn.execute(
            "SELECT count(*), count(DISTINCT followup_enrollment_id) FROM messages WHERE source = 'followup'"
        ).fetchone()
        query = "SELECT status, count(*) FROM followup_enrollments GROUP BY status"
        statuses = conn.execute(query).fetchall()
        runs = conn.execute("SELECT count(*) FROM followup_step_runs WHERE outcome = 'queued'").fetchone()
        deadlocks_after = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert counts == (ENROLLMENTS, ENROLLMENTS)
    assert runs == (ENROLLMENTS,)
    assert statuses == [("completed", ENROLLMENTS)]
    assert deadlocks_after == deadlocks_before
    # every worker took part (SKIP LOCKED spreads the claims)
    for worker in workers:
        assert any("step queued" in line for line in worker.lines), worker.output
