"""Race proof: release workers, a send lane and a stream of replies, all at once.

Afterwards SQL checks that the reply always won until the send lane picked the message up: no follow-up
was claimed after a reply from its contact had committed, no follow-up was queued after it either, no
live enrollment is left for a contact who replied, exactly one message per (enrollment, step), and
nothing deadlocked.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from benchmarks.seed import seed_due_enrollments, seed_project
from tests.helpers import start_worker, stop_all, wait_until

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

ENROLLMENTS = 5000
RELEASE_WORKERS = 3


def test_the_reply_always_wins_until_the_send_lane_claims(db_url: str, amqp_url: str, tmp_path: Path) -> None:
    # Given 5,000 due enrollments (one message step each) and nothing sent yet
    with psycopg.connect(db_url) as conn:
        project_id, sequence_id = seed_project(conn, text="Hello {{contact.name}}, shall we talk?")
        seed_due_enrollments(
            conn, project_id, sequence_id, ENROLLMENTS, due_at=datetime.now(UTC) - timedelta(seconds=1)
        )
        conn.execute(
            "CREATE TABLE race_claims (message_id uuid NOT NULL, claim_started_at timestamptz NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE race_replies (contact_id uuid NOT NULL, committed_at timestamptz NOT NULL)"
        )
        deadlocks_before = _deadlocks(conn)

    # When release workers, a send lane and a replier run side by side
    stop = tmp_path / "stop"
    roles = [
        subprocess.Popen([sys.executable, "-m", "tests.race_roles", role, db_url, str(stop)])
        for role in ("send_lane", "replier")
    ]
    env = {"DATABASE_URL": db_url, "AMQP_URL": amqp_url, "WORKER_THREADS": "1"}
    workers = [start_worker("release", env) for _ in range(RELEASE_WORKERS)]

    def all_released_and_claimed() -> bool:
        with psycopg.connect(db_url) as conn:
            left = conn.execute(
                "SELECT count(*) FROM followup_enrollments WHERE status = 'active'"
            ).fetchone()
            queued = conn.execute("SELECT count(*) FROM messages WHERE status = 'QUEUED'").fetchone()
        return left == (0,) and queued == (0,)

    try:
        # a generous bound, not a speed test: ~32 s on a quiet two-core machine, 88 s seen under load
        wait_until(
            all_released_and_claimed, timeout=240, interval=0.1, what="every follow-up released and claimed"
        )
        # Not a wait for a result: the replier keeps racing a moment after the last release, so replies also
        # land on contacts whose follow-ups are all done (the checks below must hold for those too).
        time.sleep(0.5)
    finally:
        stop.touch()
        codes = [role.wait(timeout=30) for role in roles]
        worker_codes = stop_all(workers)
    assert codes == [0, 0]
    assert worker_codes == [0] * RELEASE_WORKERS, "\n".join(w.output for w in workers)

    with psycopg.connect(db_url) as conn:
        finished = conn.execute(
            "SELECT count(*) FROM followup_enrollments WHERE status <> 'active'"
        ).fetchone()
        replies = conn.execute("SELECT count(*) FROM race_replies").fetchone()
        claims = conn.execute("SELECT count(*) FROM race_claims").fetchone()
        # Then the run really raced: everything was released, replies and claims both happened
        assert finished == (ENROLLMENTS,)
        assert replies is not None and replies[0] > 200
        assert claims is not None and claims[0] > 200

        # no follow-up was claimed by the send lane after a reply from its contact had committed
        claimed_after_reply = conn.execute(
            """
            SELECT count(*) FROM race_claims k
            JOIN messages m ON m.id = k.message_id
            WHERE m.source = 'followup'
              AND EXISTS (SELECT 1 FROM race_replies r
                          WHERE r.contact_id = m.contact_id AND r.committed_at < k.claim_started_at)
            """
        ).fetchone()
        assert claimed_after_reply == (0,)

        # no follow-up that is (or was) on its way was queued after a reply from its contact committed
        queued_after_reply = conn.execute(
            """
            SELECT count(*) FROM messages m
            WHERE m.source = 'followup' AND m.status <> 'CANCELLED'
              AND EXISTS (SELECT 1 FROM race_replies r
                          WHERE r.contact_id = m.contact_id AND r.committed_at < m.created_at)
            """
        ).fetchone()
        assert queued_after_reply == (0,)

        # every message still QUEUED when its contact replied was cancelled: none is left QUEUED
        assert conn.execute(
            "SELECT count(*) FROM messages WHERE source = 'followup' AND status = 'QUEUED'"
        ).fetchone() == (0,)

        # no live enrollment is left for a contact whose reply should have stopped it
        live_after_reply = conn.execute(
            """
            SELECT count(*) FROM followup_enrollments e
            WHERE e.status IN ('active', 'paused')
              AND EXISTS (SELECT 1 FROM race_replies r WHERE r.contact_id = e.contact_id)
            """
        ).fetchone()
        assert live_after_reply == (0,)

        # replies stopped enrollments and cancelled queued messages (the race had both outcomes)
        stopped = conn.execute(
            "SELECT count(*) FROM followup_enrollments WHERE status = 'stopped' AND reason = 'replied'"
        ).fetchone()
        assert stopped is not None and stopped[0] > 0

        # exactly one message per (enrollment, step)
        duplicates = conn.execute(
            """
            SELECT count(*) FROM (
                SELECT followup_enrollment_id, followup_step_index FROM messages WHERE source = 'followup'
                GROUP BY 1, 2 HAVING count(*) > 1
            ) d
            """
        ).fetchone()
        assert duplicates == (0,)
        runs_without_message = conn.execute(
            """
            SELECT count(*) FROM followup_step_runs r
            WHERE r.outcome = 'queued' AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = r.message_id)
            """
        ).fetchone()
        assert runs_without_message == (0,)

        # nothing deadlocked
        assert _deadlocks(conn) == deadlocks_before


def _deadlocks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])
