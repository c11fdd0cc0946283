"""PostgreSQL goes away mid-run while release workers drain due enrollments (seed 000's failure table,
"PostgreSQL restarted mid-run"): nothing lost, nothing doubled, and the workers carry on by themselves.

The workers reach the server through a TCP proxy; ``proxy.down()`` is the restart as a client sees it:
every connection dropped (what was not committed rolls back), new ones refused until ``proxy.up()``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from benchmarks.seed import seed_due_enrollments, seed_project
from tests.helpers import start_worker, stop_all, wait_until
from tests.tcp_proxy import proxied_postgres

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

ENROLLMENTS = 1500
WORKERS = 3
#: How long PostgreSQL stays away: longer than the pool's 2 s checkout timeout, so that every worker's
#: transactions and checkouts fail, not only the ones in flight.
OUTAGE_SECONDS = 4.0


def test_release_workers_lose_and_double_nothing_when_postgres_restarts_mid_run(
    db_url: str, amqp_url: str
) -> None:
    # Given 1,500 due enrollments of a one-step sequence
    with psycopg.connect(db_url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(
            conn, project_id, sequence_id, ENROLLMENTS, due_at=datetime.now(UTC) - timedelta(seconds=1)
        )

    def released() -> int:
        with psycopg.connect(db_url) as conn:
            query = "SELECT count(*) FROM followup_enrollments WHERE status <> 'active'"
            row = conn.execute(query).fetchone()
        assert row is not None
        count: int = row[0]
        return count

    proxy, url = proxied_postgres(db_url)
    env = {"DATABASE_URL": url, "AMQP_URL": amqp_url, "WORKER_THREADS": "1"}
    workers = [start_worker("release", env) for _ in range(WORKERS)]
    try:
        # When PostgreSQL goes away while the workers drain them
        wait_until(
            lambda: released() >= ENROLLMENTS // 5, timeout=60, interval=0.05, what="the drain under way"
        )
        proxy.down()
        assert released() < ENROLLMENTS
        time.sleep(OUTAGE_SECONDS)  # the outage itself: a server that refuses every connection for 4 s
        proxy.up()
        # Then the workers carry on by themselves (no nudge, no restart) until every enrollment is released
        wait_until(
            lambda: released() == ENROLLMENTS, timeout=90, interval=0.1, what="every enrollment released"
        )
    finally:
        codes = stop_all(workers)
        proxy.close()
    assert codes == [0] * WORKERS, "\n".join(w.output for w in workers)
    # And every step ran exactly once: one message and one queued step run per enrollment
    with psycopg.connect(db_url) as conn:
        messages = conn.execute(
            "SELECT count(*), count(DISTINCT followup_enrollment_id) FROM messages WHERE source = 'followup'"
        ).fetchone()
        runs = conn.execute(
            "SELECT count(*), count(DISTINCT enrollment_id) FROM followup_step_runs WHERE outcome = 'queued'"
        ).fetchone()
        statuses = conn.execute(
            "SELECT status, count(*) FROM followup_enrollments GROUP BY status"
        ).fetchall()
        # a release the outage cut is not counted as the enrollment's failure (nor backed off 30 s)
        blamed = conn.execute(
            "SELECT count(*) FROM followup_enrollments WHERE last_error IS NOT NULL"
        ).fetchone()
    assert blamed == (0,)
    assert messages == (ENROLLMENTS, ENROLLMENTS)
    assert runs == (ENROLLMENTS, ENROLLMENTS)
    assert statuses == [("completed", ENROLLMENTS)]
