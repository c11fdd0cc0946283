"""The fair claims of the rules' queues stay index-driven on a 100,000-item backlog of one project: the
projects come from a skip scan of the per-project index and each project's oldest due items from the same
index, so another project's single item is claimed without reading the backlog (custom and generic plans;
see tests/test_query_plans.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.jobs import ROUND_ROBIN
from libs.common.platform.projects import create_project
from libs.common.rules import executions, triggers
from tests.test_query_plans import explain, explain_generic, index_names, seq_scanned

BACKLOG = 100_000
NOW = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def backlog(pool: ConnectionPool) -> tuple[uuid.UUID, uuid.UUID]:
    """Project B's 100,000 due triggers and pending executions, and project A's one of each (the newest);
    returns A's trigger id and execution id."""
    with pool.connection() as conn:
        a, b = (create_project(conn, name).project_id for name in ("a", "b"))
        rules = {}
        for project in (a, b):
            row = conn.execute(
                "INSERT INTO rules (project_id, name, event, conditions, actions, active, position,"
                " created_at, updated_at)"
                " VALUES (%s, 'r', 'contact.created', '{}', '[]', true, 0, %s, %s) RETURNING id",
                (project, NOW, NOW),
            ).fetchone()
            assert row is not None
            rules[project] = row[0]
        for project, count, age in ((b, BACKLOG, timedelta(hours=1)), (a, 1, timedelta(0))):
            params = {"project": project, "n": count, "due": NOW - age, "rule": rules[project]}
            conn.execute(
                "INSERT INTO followup_triggers (project_id, type, contact_id, occurred_at, next_attempt_at)"
                " SELECT %(project)s, 'contact.created', gen_random_uuid(), %(due)s, %(due)s"
                " FROM generate_series(1, %(n)s)",
                params,
            )
            conn.execute(
                "INSERT INTO rule_pending_executions (project_id, rule_id, episode_key, due_at)"
                " SELECT %(project)s, %(rule)s, 'k' || g, %(due)s FROM generate_series(1, %(n)s) g",
                params,
            )
        conn.execute("ANALYZE followup_triggers")
        conn.execute("ANALYZE rule_pending_executions")
        trigger = conn.execute("SELECT id FROM followup_triggers WHERE project_id = %s", (a,)).fetchone()
        execution = conn.execute(
            "SELECT id FROM rule_pending_executions WHERE project_id = %s", (a,)
        ).fetchone()
    assert trigger is not None and execution is not None
    return trigger[0], execution[0]


def _params() -> dict[str, Any]:
    return {"now": NOW, "limit": 100, "until": NOW + timedelta(minutes=2)} | ROUND_ROBIN.params()


@pytest.mark.parametrize(
    ("queries", "name", "table", "index"),
    [
        (triggers.QUERIES, "claim_triggers", "followup_triggers", "followup_triggers_project_pending_idx"),
        (
            executions.QUERIES,
            "claim_due",
            "rule_pending_executions",
            "rule_pending_executions_project_due_idx",
        ),
    ],
)
def test_the_fair_claim_walks_the_per_project_index_on_a_backlog_and_takes_the_lone_projects_item(
    pool: ConnectionPool,
    backlog: tuple[uuid.UUID, uuid.UUID],
    queries: dict[str, str],
    name: str,
    table: str,
    index: str,
) -> None:
    query = queries[name]
    with pool.connection() as conn:
        custom = explain(conn, query, _params())
        generic = explain_generic(conn, query)
        for nodes in (custom, generic):
            assert index in index_names(nodes)
            assert table not in seq_scanned(nodes)
        claimed = [row[0] for row in conn.execute(query, _params()).fetchall()]
        conn.rollback()
    mine = backlog[0] if name == "claim_triggers" else backlog[1]
    assert len(claimed) == 100 and mine in claimed  # among the first of a batch that B fills otherwise
