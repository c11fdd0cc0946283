"""The indexes that carry the design are the ones the planner picks, on its own, once the tables hold enough
rows: the stop UPDATE, the release claim, the send-lane claim and the cancel of queued follow-ups.

Each query is explained twice: with its parameters bound (the custom plan of the first executions) and as a
generic plan (what a prepared statement settles on after a few executions: psycopg prepares a query it
has run five times)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.db import create_pool
from libs.common.core.settings import DatabaseSettings, FollowupSettings
from libs.common.core.sql import load_queries
from libs.common.followups import goals, release_state, stops
from libs.common.followups.definition import MessageStep
from libs.common.platform import send_lane
from libs.common.platform.projects import create_project
from services.release.release import release_batch
from tests.conftest import database_from, with_database
from tests.factories import make_contact, make_enrollment, make_sequence

RELEASE_QUERIES = load_queries("libs.common.followups", "release_claim.sql")

#: Rows of other contacts in the tables, enough that a sequential scan is clearly the worse plan.
OTHER_CONTACTS = 5000
NOW = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


def plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan tree, init plans and CTEs included."""
    if isinstance(plan, list):
        for item in plan:
            yield from plan_nodes(item)
    elif isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for key in ("Plan", "Plans"):
            if key in plan:
                yield from plan_nodes(plan[key])


def explain(conn: Connection[Any], query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    row = conn.execute(f"EXPLAIN (FORMAT JSON) {query}", params).fetchone()
    assert row is not None
    return list(plan_nodes(row[0]))


def explain_generic(conn: Connection[Any], query: str) -> list[dict[str, Any]]:
    """The generic plan (parameters as ``$n``, values unknown), as a prepared statement may come to use."""
    numbers: dict[str, int] = {}

    def placeholder(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    generic = re.sub(r"%\((\w+)\)s", placeholder, query)
    row = conn.execute(f"EXPLAIN (GENERIC_PLAN, FORMAT JSON) {generic}".replace("%", "%%")).fetchone()
    assert row is not None
    return list(plan_nodes(row[0]))


def index_names(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Index Name"] for n in nodes if "Index Name" in n}


def seq_scanned(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"}


class Seeded:
    """A project with OTHER_CONTACTS contacts, each enrolled and with a sent message (a tenth also with a
    queued one), and one contact of interest whose follow-up message is QUEUED."""

    def __init__(self, pool: ConnectionPool, project_id: uuid.UUID) -> None:
        clock = ManualClock(NOW)
        sequence = make_sequence(pool, project_id)
        self.contact = make_contact(pool, project_id)
        two_steps = make_sequence(
            pool, project_id, MessageStep(text="now"), MessageStep(text="tomorrow", delay_seconds=86400)
        )
        self.enrollment = make_enrollment(pool, clock, project_id, two_steps, self.contact).id
        assert release_batch(pool, clock, FollowupSettings()) == 1
        with pool.connection() as conn:
            params = {"project_id": project_id, "sequence_id": sequence, "n": OTHER_CONTACTS, "now": NOW}
            conn.execute(
                """
                INSERT INTO contacts (project_id, phone)
                SELECT %(project_id)s, '+1666' || lpad(g::text, 7, '0') FROM generate_series(1, %(n)s) g
                """,
                params,
            )
            conn.execute(
                """
                INSERT INTO followup_enrollments (project_id, sequence_id, version_id, contact_id, status,
                                                  next_run_at, enrolled_at, updated_at, finished_at)
                SELECT c.project_id, s.id, s.current_version_id, c.id,
                       CASE WHEN n %% 10 < 6 THEN 'active' WHEN n %% 10 = 6 THEN 'paused'
                            WHEN n %% 10 < 9 THEN 'completed' ELSE 'stopped' END,
                       %(now)s + make_interval(mins => n::int), %(now)s, %(now)s,
                       CASE WHEN n %% 10 > 6 THEN %(now)s END
                FROM (SELECT c.*, row_number() OVER (ORDER BY c.id) AS n
                      FROM contacts c WHERE c.project_id = %(project_id)s AND c.id <> %(contact)s) c
                JOIN followup_sequences s ON s.id = %(sequence_id)s
                """,
                params | {"contact": self.contact},
            )
            conn.execute(
                """
                INSERT INTO messages (project_id, contact_id, direction, status, source, priority,
                                      body, followup_enrollment_id, followup_step_index, created_at,
                                      status_changed_at)
                SELECT c.project_id, c.id, 'outbound', m.status, 'followup', 5, 'hello', e.id, m.step,
                       %(now)s - make_interval(mins => m.age), %(now)s
                FROM contacts c
                JOIN followup_enrollments e ON e.contact_id = c.id
                CROSS JOIN LATERAL (VALUES ('READ', 120, 0), ('SENT', 60, 1),
                    (CASE WHEN right(c.phone, 1) = '0' THEN 'QUEUED' ELSE 'DELIVERED' END, 30, 2))
                    AS m(status, age, step)
                WHERE c.project_id = %(project_id)s AND c.id <> %(contact)s
                """,
                params | {"contact": self.contact},
            )
            for table in ("contacts", "followup_enrollments", "messages"):
                conn.execute(f"ANALYZE {table}")
        self.project_id = project_id


@dataclass(frozen=True)
class SeededDatabase:
    name: str
    seeded: Seeded


@pytest.fixture(scope="module")
def seeded_database(server_url: str, template_db: str) -> Iterator[SeededDatabase]:
    """The seeded rows, written and analyzed once per module in a database of their own (seeding takes
    most of a second): each test gets a copy of it, statistics included, in ``db_url``."""
    with database_from(server_url, template_db) as name:
        pool = create_pool(DatabaseSettings(url=with_database(server_url, name)), name="followups-seed")
        try:
            with pool.connection() as conn:
                project = create_project(conn, "query plans")
            seeded = Seeded(pool, project.project_id)
        finally:
            pool.close()  # a template database must have no session open when it is copied
        yield SeededDatabase(name, seeded)


@pytest.fixture
def db_url(server_url: str, seeded_database: SeededDatabase) -> Iterator[str]:
    """This module's tests run on a fresh copy of the seeded database, as the others on one of the
    migrated template."""
    with database_from(server_url, seeded_database.name) as name:
        yield with_database(server_url, name)


@pytest.fixture
def seeded(seeded_database: SeededDatabase) -> Seeded:
    return seeded_database.seeded


def _stop_params(seeded: Seeded, conversation_id: uuid.UUID | None = None) -> dict[str, Any]:
    return {
        "project_id": seeded.project_id,
        "contact_id": seeded.contact,
        "flag": "reply",
        "conversation_id": conversation_id,
        "enrollment_id": None,
    }


def test_the_stop_lock_uses_the_live_contact_index(pool: ConnectionPool, seeded: Seeded) -> None:
    query = stops.QUERIES["lock_stoppable"]
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        for nodes in (
            explain(conn, query, _stop_params(seeded)),
            explain(conn, query, _stop_params(seeded, uuid.uuid4())),
            explain_generic(conn, query),
        ):
            assert "followup_enrollments_live_contact_idx" in index_names(nodes), nodes
            assert "followup_enrollments" not in seq_scanned(nodes)
        # the plan is the real one: run, it locks exactly the contact's follow-up
        stoppable = conn.execute(query, _stop_params(seeded)).fetchall()
        assert [row[0] for row in stoppable] == [seeded.enrollment]


def test_the_queued_follow_ups_to_cancel_are_found_by_the_queued_contact_index(
    pool: ConnectionPool, seeded: Seeded
) -> None:
    query = stops.QUERIES["queued_followups"]
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        for nodes in (explain(conn, query, _stop_params(seeded)), explain_generic(conn, query)):
            assert "messages_queued_contact_idx" in index_names(nodes), nodes
            assert "messages" not in seq_scanned(nodes)
        queued = conn.execute(query, _stop_params(seeded)).fetchall()
        assert len(queued) == 1


def test_the_enrollments_a_goal_may_meet_are_found_by_the_contact_index(
    pool: ConnectionPool, seeded: Seeded
) -> None:
    query = goals.QUERIES["candidates"]
    params = {"project_id": seeded.project_id, "contact_id": seeded.contact, "since": NOW}
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        for nodes in (explain(conn, query, params), explain_generic(conn, query)):
            assert index_names(nodes) & {
                "followup_enrollments_contact_idx",
                "followup_enrollments_live_contact_idx",
            }, nodes
            assert "followup_enrollments" not in seq_scanned(nodes)
        assert [row[0] for row in conn.execute(query, params).fetchall()] == [seeded.enrollment]


def test_the_events_of_a_projects_goals_are_read_through_the_version_key(
    pool: ConnectionPool, seeded: Seeded
) -> None:
    query = goals.QUERIES["criteria_events"]
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        for nodes in (explain(conn, query, {"project_id": seeded.project_id}), explain_generic(conn, query)):
            assert "followup_sequence_versions" not in seq_scanned(nodes), nodes


def test_the_release_claim_uses_the_project_claim_index(pool: ConnectionPool, seeded: Seeded) -> None:
    query = RELEASE_QUERIES["claim_due_enrollment"]
    params = {"project_id": seeded.project_id, "now": NOW}
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        for nodes in (explain(conn, query, params), explain_generic(conn, query)):
            assert index_names(nodes) == {"followup_enrollments_project_claim_idx"}, nodes
            assert "followup_enrollments" not in seq_scanned(nodes)


def test_the_walk_of_the_projects_with_due_enrollments_is_a_skip_scan(
    pool: ConnectionPool, seeded: Seeded
) -> None:
    """Each step of the walk and each due check is a descent of the project-led claim index: no backlog
    is read, and the table is never scanned."""
    query = RELEASE_QUERIES["due_projects"]
    params = {"now": NOW, "after": uuid.UUID(int=0), "projects": 100}
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        for nodes in (explain(conn, query, params), explain_generic(conn, query)):
            assert index_names(nodes) == {"followup_enrollments_project_claim_idx"}, nodes
            assert "followup_enrollments" not in seq_scanned(nodes)


def test_the_release_loops_next_due_time_walks_the_claim_index(pool: ConnectionPool, seeded: Seeded) -> None:
    query = RELEASE_QUERIES["next_due"]
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        for nodes in (explain(conn, query, {"now": NOW}), explain_generic(conn, query)):
            assert index_names(nodes) == {"followup_enrollments_project_claim_idx"}, nodes
            assert "followup_enrollments" not in seq_scanned(nodes)


def test_the_send_lane_claim_walks_the_projects_queued_index_in_order(
    pool: ConnectionPool, seeded: Seeded
) -> None:
    """One project's claim (a claim for all projects is one per project in turn): its own queue, priority
    then age, from the queued project index; the shares read the same index, one descent a project."""
    query = send_lane.CLAIM_QUEUED_MESSAGES
    params = {"project_id": seeded.project_id, "number_id": None, "share": 50, "now": NOW}
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        nodes = explain(conn, query, params)
        assert "messages_queued_project_idx" in index_names(nodes), nodes
        assert "messages" not in seq_scanned(nodes)
        shares = send_lane.QUERIES["queued_shares"]
        share_params = {"after": uuid.UUID(int=0), "projects": 50, "limit": 50, "number_id": None, "now": NOW}
        nodes = explain(conn, shares, share_params)
        assert "messages" not in seq_scanned(nodes)
        claimed = conn.execute(query, params)
        assert len(claimed.fetchall()) == 50


def test_the_send_lane_claim_is_never_a_prepared_statement(pool: ConnectionPool, seeded: Seeded) -> None:
    """A generic plan of the claim cannot tell which optional filters are NULL: it guesses a few rows and
    sorts the whole QUEUED backlog instead of walking the index. So the claim must never be prepared
    (psycopg would prepare it after five runs on a connection, and PostgreSQL then switch to that plan)."""
    query = send_lane.CLAIM_QUEUED_MESSAGES
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        generic = explain_generic(conn, query)
        assert "messages_send_queue_idx" not in index_names(generic)  # why: the plan it would come to use
        request = send_lane.ClaimRequest(limit=1)
        for _ in range(12):
            assert len(send_lane.claim_messages(conn, seeded.project_id, request, now=NOW)) == 1
        prepared = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        assert not [s for (s,) in prepared if "message.claimed" in s]


def test_the_release_state_reads_no_message_history(pool: ConnectionPool, seeded: Seeded) -> None:
    """The step's state reads the contact's last inbound time from the contact row: of the messages table
    it reads only the previous step's message, by key, the contact's messages of the last 24 hours (only
    when a cap is set) and its newest outbound one (the spacing per contact), newest first, so its cost does
    not grow with the contact's history: each read is a descent of the project's index of a contact's
    messages (newest first) or of the table's key."""
    query = release_state.QUERIES["release_state"]
    params = {
        "project_id": seeded.project_id,
        "contact_id": seeded.contact,
        "sequence_id": None,
        "enrolled_at": NOW,
        "last_message_id": None,
        "number_id": None,
        "fixed_number_id": None,
        "conversation_id": None,
        "default_recipient_gap": 6,
        "now": NOW,
    }
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        for nodes in (explain(conn, query, params), explain_generic(conn, query)):
            on_messages = [n for n in nodes if n.get("Relation Name") == "messages"]
            assert on_messages, nodes
            assert {n.get("Index Name", n["Node Type"]) for n in on_messages} <= {
                "messages_project_contact_idx",
                "messages_pkey",
            }, on_messages
