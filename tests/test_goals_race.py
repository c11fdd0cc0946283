"""Race proof for goals and exits (the reply race's shape, tests/test_race.py): release workers, a send lane
and a stream of goal and exit events (a lead won, a tag added), all at once.

Afterwards SQL checks that the goal or exit always won until the send lane picked the message up: no
follow-up was claimed, nor queued, after its contact's goal or exit had committed; none is left QUEUED;
every contact whose goal was met has its enrollment converted (at once, or late once it had completed),
every contact whose exit was met has none live; the live counter equals a count; exactly one message per
(enrollment, step); nothing deadlocked.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from benchmarks.seed import seed_due_enrollments
from libs.common.followups.definition import Definition, Exit, Goal, MessageStep
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.platform.projects import create_project
from tests.helpers import start_worker, stop_all, wait_until

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

ENROLLMENTS = 1500
RELEASE_WORKERS = 2


def _seed(conn: psycopg.Connection[Any]) -> None:
    """A project whose two-step sequence has a goal (the lead won) and an exit (tagged gone), every contact
    enrolled and due, each with a lead."""
    project_id = create_project(conn, "goals race").project_id
    definition = Definition(
        steps=[MessageStep(text="Hello {{contact.name}}"), MessageStep(text="Still there?", delay_seconds=1)],
        goals=[
            Goal(
                name="won",
                event="lead.status_changed",
                conditions={"attribute": "lead.status", "operator": "equal_to", "value": "won"},
            )
        ],
        exits=[
            Exit(
                name="gone",
                event="contact.tag_added",
                conditions={"attribute": "event.tags_added", "operator": "contains", "value": "gone"},
            )
        ],
    )
    sequence = create_sequence(conn, project_id, SequenceCreate(name="goals race", definition=definition))
    publish_sequence(conn, project_id, sequence.id)
    seed_due_enrollments(
        conn, project_id, sequence.id, ENROLLMENTS, due_at=datetime.now(UTC) - timedelta(seconds=1)
    )
    conn.execute(
        "INSERT INTO followup_live_counters (project_id, shard, live) VALUES (%s, 0, %s)",
        (project_id, ENROLLMENTS),
    )
    conn.execute("INSERT INTO leads (project_id, contact_id) SELECT project_id, id FROM contacts")
    conn.execute("CREATE TABLE race_claims (message_id uuid NOT NULL, claim_started_at timestamptz NOT NULL)")
    conn.execute(
        "CREATE TABLE race_goals"
        " (contact_id uuid NOT NULL, kind text NOT NULL, committed_at timestamptz NOT NULL)"
    )


def test_a_goal_or_exit_always_wins_until_the_send_lane_claims(
    db_url: str, amqp_url: str, tmp_path: Path
) -> None:
    # Given due enrollments (two message steps each, a goal and an exit) and nothing sent yet
    with psycopg.connect(db_url) as conn:
        _seed(conn)
        deadlocks_before = _deadlocks(conn)

    # When release workers, a send lane and the goals and exits run side by side
    stop = tmp_path / "stop"
    roles = [
        subprocess.Popen([sys.executable, "-m", "tests.race_roles", "send_lane", db_url, str(stop)]),
        subprocess.Popen([sys.executable, "-m", "tests.goals_race_roles", db_url, str(stop)]),
    ]
    env = {"DATABASE_URL": db_url, "AMQP_URL": amqp_url, "WORKER_THREADS": "1"}
    workers = [start_worker("release", env) for _ in range(RELEASE_WORKERS)]

    def all_done() -> bool:
        with psycopg.connect(db_url) as conn:
            left = conn.execute(
                "SELECT count(*) FROM followup_enrollments WHERE status = 'active'"
            ).fetchone()
            queued = conn.execute("SELECT count(*) FROM messages WHERE status = 'QUEUED'").fetchone()
            met = conn.execute("SELECT count(*) FROM race_goals").fetchone()
        return left == (0,) and queued == (0,) and met == (ENROLLMENTS,)

    try:
        # a generous bound, not a speed test
        wait_until(all_done, timeout=300, interval=0.1, what="every follow-up released, claimed or met")
    finally:
        stop.touch()
        codes = [role.wait(timeout=30) for role in roles]
        worker_codes = stop_all(workers)
    assert codes == [0, 0]
    assert worker_codes == [0] * RELEASE_WORKERS, "\n".join(w.output for w in workers)

    with psycopg.connect(db_url) as conn:

        def one(query: str) -> Any:
            row = conn.execute(query).fetchone()
            assert row is not None
            return row[0] if len(row) == 1 else row

        # Then the run really raced: claims happened, and goals met live, late, and exits
        assert one("SELECT count(*) FROM race_claims") > 100
        assert one("SELECT count(*) FROM followup_enrollments WHERE status = 'converted'") > 0
        assert one("SELECT count(*) FROM followup_enrollments WHERE status = 'exited'") > 0

        # no follow-up was claimed by the send lane after its contact's goal or exit had committed
        assert (
            one(
                """
            SELECT count(*) FROM race_claims k JOIN messages m ON m.id = k.message_id
            WHERE EXISTS (SELECT 1 FROM race_goals g
                          WHERE g.contact_id = m.contact_id AND g.committed_at < k.claim_started_at)
            """
            )
            == 0
        )
        # no follow-up that is (or was) on its way was queued after it
        assert (
            one(
                """
            SELECT count(*) FROM messages m
            WHERE m.source = 'followup' AND m.status <> 'CANCELLED'
              AND EXISTS (SELECT 1 FROM race_goals g
                          WHERE g.contact_id = m.contact_id AND g.committed_at < m.created_at)
            """
            )
            == 0
        )
        assert one("SELECT count(*) FROM messages WHERE source = 'followup' AND status = 'QUEUED'") == 0

        # every goal met converted its enrollment (at once, or late once it had completed), once
        assert (
            one(
                """
            SELECT count(*) FROM race_goals g JOIN followup_enrollments e ON e.contact_id = g.contact_id
            WHERE g.kind = 'goal' AND NOT (e.goal = 'won' AND e.converted_at IS NOT NULL
                                           AND e.status IN ('converted', 'completed'))
            """
            )
            == 0
        )
        # every exit met left nothing live, and named itself on those it ended
        assert (
            one(
                """
            SELECT count(*) FROM race_goals g JOIN followup_enrollments e ON e.contact_id = g.contact_id
            WHERE g.kind = 'exit'
              AND NOT (e.status = 'completed' OR (e.status = 'exited' AND e.exited_by = 'gone'))
            """
            )
            == 0
        )
        converted_events = one("SELECT count(*) FROM outbox WHERE type = 'followup.converted'")
        assert converted_events == one("SELECT count(*) FROM race_goals WHERE kind = 'goal'")

        # the live counter equals a count (none live)
        assert one("SELECT coalesce(sum(live), 0) FROM followup_live_counters") == 0

        # exactly one message per (enrollment, step)
        assert (
            one(
                """
            SELECT count(*) FROM (
                SELECT followup_enrollment_id, followup_step_index FROM messages WHERE source = 'followup'
                GROUP BY 1, 2 HAVING count(*) > 1
            ) d
            """
            )
            == 0
        )

        # nothing deadlocked
        assert _deadlocks(conn) == deadlocks_before


def _deadlocks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])
