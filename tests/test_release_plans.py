"""The release step's statements are planned once per connection: after PostgreSQL's first five custom plans
of a prepared statement, it keeps the generic one when that costs no more. A statement whose generic plan is
estimated dearer (``id = ANY(%(ids)s)`` for what is always one id: an array is estimated at ten rows) is
planned again at every execution, in every step, on the database's CPU."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from psycopg_pool import ConnectionPool

from benchmarks.seed import seed_due_enrollments, seed_history
from libs.common.core.clock import ManualClock
from libs.common.core.db import create_pool
from libs.common.core.settings import DatabaseSettings
from libs.common.followups.definition import MessageStep
from tests.conftest import Project
from tests.release_helpers import release_all, sequence

#: Enrollments in the table (plans are costed on its statistics), and how many of them are due.
ENROLLED = 2_000
DUE = 40


@pytest.fixture
def one_connection(db_url: str) -> Iterator[ConnectionPool]:
    """A pool of one connection: every step on it, and its prepared statements read back from it."""
    pool = create_pool(DatabaseSettings(url=db_url, pool_min_size=1, pool_max_size=1))
    yield pool
    pool.close()


def _shortened(statement: str) -> str:
    """The statement's start and end, on one line (the parts of a statement come first)."""
    text = " ".join(statement.split())
    return f"{text[:60]} ... {text[-200:]}"


def _release_due(pool: ConnectionPool, clock: ManualClock) -> int:
    """Every due step released, batch after batch (a batch releases a turn of a project's steps)."""
    released = 0
    while handled := release_all(pool, clock):
        released += handled
    return released


def test_each_statement_of_a_step_that_advances_or_finishes_is_planned_once(
    one_connection: ConnectionPool, project: Project, clock: ManualClock
) -> None:
    pool = one_connection
    sequence_id = sequence(
        pool, project.id, MessageStep(text="Hi {{contact.name}}"), MessageStep(text="Again", delay_seconds=60)
    )
    with pool.connection() as conn:  # plans are costed on the tables' statistics: tables of some size
        seed_due_enrollments(conn, project.id, sequence_id, ENROLLED, due_at=clock.now() + timedelta(days=1))
        seed_history(conn, project.id, before=clock.now())
        conn.execute(
            "UPDATE followup_enrollments SET next_run_at = %(now)s, step_due_at = %(now)s"
            " WHERE id IN (SELECT id FROM followup_enrollments ORDER BY id LIMIT %(due)s)",
            {"now": clock.now(), "due": DUE},
        )
        conn.execute("ANALYZE")
    assert _release_due(pool, clock) == DUE  # the first steps: each advances its enrollment
    clock.advance(timedelta(seconds=60))
    assert _release_due(pool, clock) == DUE  # the last steps: each finishes its enrollment

    with pool.connection() as conn:
        plans = conn.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE generic_plans + custom_plans >= %s",
            (DUE - 10,),
        ).fetchall()
    assert plans, "the steps' statements were not prepared"
    statements = " ".join(statement for statement, _, _ in plans)
    assert "INSERT INTO messages" in statements and "UPDATE followup_enrollments" in statements
    replanned = [
        (_shortened(statement), custom)
        for statement, generic, custom in plans
        if custom > 5  # PostgreSQL's first five are custom plans, whatever the statement
    ]
    assert replanned == [], replanned
