"""The release step's and the stop path's statements are planned once per connection: after PostgreSQL's first
five custom plans of a prepared statement, it keeps the generic one when that costs no more. A statement whose
generic plan is estimated dearer (``id = ANY(%(ids)s)`` for what is one id: an array is estimated at ten rows)
is planned again at every execution, in every step or stop, on the database's CPU."""

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
from libs.common.followups.stops import stop_followups_for_contact
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


@pytest.fixture
def due(one_connection: ConnectionPool, project: Project, clock: ManualClock) -> ConnectionPool:
    """:data:`DUE` contacts whose two-step sequence's first step is due, among :data:`ENROLLED`."""
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
    return pool


def _replanned(pool: ConnectionPool, *written: str) -> list[tuple[str, int]]:
    """The connection's statements run at least ``DUE - 10`` times that were planned again more than
    PostgreSQL's first five times, with how many times; ``written``: what they must include between them
    (the statements under test were prepared)."""
    with pool.connection() as conn:
        plans = conn.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE generic_plans + custom_plans >= %s",
            (DUE - 10,),
        ).fetchall()
    statements = " ".join(statement for statement, _, _ in plans)
    assert all(part in statements for part in written), (written, statements)
    return [(_shortened(statement), custom) for statement, _, custom in plans if custom > 5]


def test_each_statement_of_a_step_that_advances_or_finishes_is_planned_once(
    due: ConnectionPool, clock: ManualClock
) -> None:
    assert _release_due(due, clock) == DUE  # the first steps: each advances its enrollment
    clock.advance(timedelta(seconds=60))
    assert _release_due(due, clock) == DUE  # the last steps: each finishes its enrollment
    assert _replanned(due, "INSERT INTO messages", "UPDATE followup_enrollments") == []


def test_each_statement_of_a_stop_of_one_enrollment_and_one_queued_message_is_planned_once(
    due: ConnectionPool, project: Project, clock: ManualClock
) -> None:
    assert _release_due(due, clock) == DUE  # each contact has one live enrollment and one queued message
    with due.connection() as conn:
        contacts = [row[0] for row in conn.execute("SELECT contact_id FROM messages WHERE status = 'QUEUED'")]
    assert len(contacts) == DUE
    for contact_id in contacts:
        with due.connection() as conn:
            stopped = stop_followups_for_contact(conn, project.id, contact_id, "reply", now=clock.now())
        assert len(stopped.enrollment_ids) == 1 and len(stopped.cancelled_message_ids) == 1
    assert _replanned(due, "UPDATE followup_enrollments", "UPDATE messages") == []
