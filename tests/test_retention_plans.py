"""Each retention delete walks an index to the rows it removes, once the tables hold enough rows: most of them
recent (kept), a tenth past their time."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from psycopg_pool import ConnectionPool

from libs.common.core import outbox
from libs.common.core.db import create_pool
from libs.common.core.settings import DatabaseSettings
from libs.common.followups import transitions
from libs.common.platform import sessions
from libs.common.platform.projects import create_project
from libs.common.rules import purge as rules_purge
from tests.conftest import database_from, with_database
from tests.factories import make_sequence
from tests.test_query_plans import explain, index_names, seq_scanned

NOW = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
ROWS = 20_000
#: The owners' batched deletes the retention job calls.
QUERIES = transitions.QUERIES | rules_purge.QUERIES | outbox.QUERIES | sessions.QUERIES


def _seed(pool: ConnectionPool, project_id: uuid.UUID) -> None:
    params = {"project_id": project_id, "n": ROWS, "now": NOW}
    sequence_id = make_sequence(pool, project_id)
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO contacts (project_id, phone) SELECT %(project_id)s, '+1777' || lpad(g::text, 7, '0')"
            " FROM generate_series(1, %(n)s) g",
            params,
        )
        version = conn.execute(
            "SELECT id, current_version_id FROM followup_sequences WHERE id = %s", (sequence_id,)
        ).fetchone()
        assert version is not None
        sequence = (version[0],)
        version = (version[1],)
        # enrollments: most live, some finished recently, a tenth finished long ago
        conn.execute(
            """
            INSERT INTO followup_enrollments (project_id, version_id, contact_id, status, next_run_at,
                                              enrolled_at, updated_at, finished_at)
            SELECT %(project_id)s, %(version)s, c.id,
                   CASE WHEN n %% 10 < 6 THEN 'active' ELSE 'completed' END, %(now)s, %(now)s, %(now)s,
                   CASE WHEN n %% 10 = 9 THEN %(now)s - interval '200 days'
                        WHEN n %% 10 > 5 THEN %(now)s - interval '1 day' END
            FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM contacts
                  WHERE project_id = %(project_id)s) c
            """,
            params | {"version": version[0]},
        )
        conn.execute(
            """
            INSERT INTO followup_triggers (project_id, type, contact_id, occurred_at, next_attempt_at,
                                           processed_at)
            SELECT %(project_id)s, 'contact.created', c.id, %(now)s, %(now)s,
                   %(now)s - CASE WHEN n %% 10 = 9 THEN interval '30 days' ELSE interval '1 hour' END
            FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM contacts
                  WHERE project_id = %(project_id)s) c
            """,
            params,
        )
        conn.execute(
            """
            INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at,
                                published_at)
            SELECT %(project_id)s, 'x', 'y', gen_random_uuid(), '{}', %(now)s,
                   %(now)s - CASE WHEN g %% 10 = 9 THEN interval '30 days' ELSE interval '1 hour' END
            FROM generate_series(1, %(n)s) g
            """,
            params,
        )
        rule = conn.execute(
            "INSERT INTO rules (project_id, name, event, actions) VALUES (%(project_id)s, 'r', 'x', '[]')"
            " RETURNING id",
            params,
        ).fetchone()
        assert rule is not None
        conn.execute(
            """
            INSERT INTO rule_pending_executions (project_id, rule_id, episode_key, due_at, status, created_at,
                                                 updated_at)
            SELECT %(project_id)s, %(rule)s, 'event:' || g, %(now)s,
                   CASE WHEN g %% 2 = 0 THEN 'pending' ELSE 'executed' END, %(now)s,
                   %(now)s - CASE WHEN g %% 10 = 9 THEN interval '60 days' ELSE interval '1 hour' END
            FROM generate_series(1, %(n)s) g
            """,
            params | {"rule": rule[0]},
        )
        conn.execute(
            """
            INSERT INTO webhook_deliveries (project_id, url, payload, status, created_at, updated_at)
            SELECT %(project_id)s, 'https://example.com', '{}',
                   CASE WHEN g %% 3 = 0 THEN 'pending' ELSE 'delivered' END, %(now)s,
                   %(now)s - CASE WHEN g %% 10 = 9 THEN interval '60 days' ELSE interval '1 hour' END
            FROM generate_series(1, %(n)s) g
            """,
            params,
        )
        conn.execute(
            """
            INSERT INTO followup_bulk_jobs (project_id, sequence_id, status, created_at, updated_at,
                                            finished_at)
            SELECT %(project_id)s, %(sequence)s,
                   CASE WHEN g %% 4 = 0 THEN 'queued' ELSE 'completed' END, %(now)s, %(now)s,
                   CASE WHEN g %% 4 = 0 THEN NULL
                        ELSE %(now)s - CASE WHEN g %% 10 = 9 THEN interval '60 days'
                                            ELSE interval '1 hour' END
                   END
            FROM generate_series(1, %(n)s) g
            """,
            params | {"sequence": sequence[0]},
        )
        # dashboard sessions: most live, a tenth expired
        conn.execute(
            """
            INSERT INTO dashboard_sessions (project_id, api_key_id, token_hash, created_at, expires_at)
            SELECT %(project_id)s, k.id, sha256(g::text::bytea), %(now)s,
                   %(now)s + CASE WHEN g %% 10 = 9 THEN interval '-1 hour' ELSE interval '1 hour' END
            FROM generate_series(1, %(n)s) g, (SELECT id FROM api_keys WHERE project_id = %(project_id)s) k
            """,
            params,
        )
        for table in (
            "dashboard_sessions",
            "followup_enrollments",
            "followup_triggers",
            "outbox",
            "rule_pending_executions",
            "webhook_deliveries",
            "followup_bulk_jobs",
        ):
            conn.execute(f"ANALYZE {table}")


@pytest.fixture(scope="module")
def seeded_database(server_url: str, template_db: str) -> Iterator[tuple[str, uuid.UUID]]:
    """The seeded database's name and its project's id."""
    with database_from(server_url, template_db) as name:
        pool = create_pool(DatabaseSettings(url=with_database(server_url, name)), name="followups-seed")
        try:
            with pool.connection() as conn:
                project = create_project(conn, "retention plans")
            _seed(pool, project.project_id)
        finally:
            pool.close()
        yield name, project.project_id


@pytest.fixture
def db_url(server_url: str, seeded_database: tuple[str, uuid.UUID]) -> Iterator[str]:
    with database_from(server_url, seeded_database[0]) as name:
        yield with_database(server_url, name)


@pytest.mark.parametrize(
    ("query", "table", "index"),
    [
        ("finished_enrollments", "followup_enrollments", "followup_enrollments_finished_idx"),
        ("processed_triggers", "followup_triggers", "followup_triggers_processed_idx"),
        ("rule_executions", "rule_pending_executions", "rule_pending_executions_done_idx"),
        ("bulk_jobs", "followup_bulk_jobs", "followup_bulk_jobs_finished_idx"),
        ("webhook_deliveries", "webhook_deliveries", "webhook_deliveries_done_idx"),
        ("published_outbox", "outbox", "outbox_published_idx"),
        ("purge_expired_sessions", "dashboard_sessions", "dashboard_sessions_expires_idx"),
    ],
)
def test_each_retention_delete_walks_its_index(
    pool: ConnectionPool, seeded_database: tuple[str, uuid.UUID], query: str, table: str, index: str
) -> None:
    """Each project's delete walks the project's part of its index (the sessions', a reference table's,
    the whole index)."""
    params = {"project_id": seeded_database[1], "now": NOW, "limit": 5000}
    with pool.connection() as conn:
        nodes = explain(conn, QUERIES[query], params)
    assert index in index_names(nodes), f"{query}: {index} not used"
    assert table not in seq_scanned(nodes), f"{query}: {table} read whole"
