"""core.db.pipelined_transaction: one transaction in one pipeline, BEGIN sent with the first statement and
COMMIT with the last writes. What is written is committed together or not at all (a statement that fails,
an exception out of the block, a COMMIT that fails); the connection comes back idle with its autocommit
setting, usable; and the round trips are the reads' plus one (counted from libpq's trace of the
connection)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from libs.common.core.db import pipelined_transaction
from tests.helpers import RoundTrips

TABLE = """
CREATE TABLE IF NOT EXISTS pipelined (id integer PRIMARY KEY, note text);
CREATE TABLE IF NOT EXISTS pipelined_deferred (
    id integer PRIMARY KEY,
    parent integer REFERENCES pipelined (id) DEFERRABLE INITIALLY DEFERRED
);
"""


@pytest.fixture
def table(pool: ConnectionPool) -> ConnectionPool:
    with pool.connection() as conn:
        conn.execute(TABLE)
    return pool


def stored(pool: ConnectionPool) -> list[tuple[Any, ...]]:
    with pool.connection() as conn:
        return conn.execute("SELECT id, note FROM pipelined ORDER BY id").fetchall()


def idle_and_usable(conn: psycopg.Connection[Any]) -> None:
    assert not conn.closed
    assert conn.autocommit is False
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert conn.execute("SELECT 1").fetchone() == (1,)
    conn.rollback()


def test_what_the_block_writes_is_committed_and_the_connection_comes_back_as_it_was(
    table: ConnectionPool,
) -> None:
    with table.connection() as conn:
        with pipelined_transaction(conn):
            row = conn.execute("INSERT INTO pipelined VALUES (1, 'read') RETURNING id").fetchone()
            assert row == (1,)
            conn.execute("INSERT INTO pipelined VALUES (2, 'written')")
        idle_and_usable(conn)
    assert stored(table) == [(1, "read"), (2, "written")]


def test_a_statement_that_fails_rolls_everything_back_and_is_raised(table: ConnectionPool) -> None:
    with table.connection() as conn:
        conn.execute("INSERT INTO pipelined VALUES (1, 'before')")
        conn.commit()
        with pytest.raises(errors.UniqueViolation), pipelined_transaction(conn):
            conn.execute("INSERT INTO pipelined VALUES (2, 'first')")
            conn.execute("INSERT INTO pipelined VALUES (1, 'duplicate')")
            conn.execute("INSERT INTO pipelined VALUES (3, 'after')")
        idle_and_usable(conn)
    assert stored(table) == [(1, "before")]


def test_an_exception_out_of_the_block_rolls_the_writes_back(table: ConnectionPool) -> None:
    with table.connection() as conn:
        with pytest.raises(RuntimeError, match="the caller's"), pipelined_transaction(conn):
            conn.execute("INSERT INTO pipelined VALUES (1, 'read') RETURNING id").fetchone()
            conn.execute("INSERT INTO pipelined VALUES (2, 'unread')")
            raise RuntimeError("the caller's")
        idle_and_usable(conn)
    assert stored(table) == []


def test_a_commit_that_fails_stores_nothing_and_is_raised(table: ConnectionPool) -> None:
    with table.connection() as conn:
        with pytest.raises(errors.ForeignKeyViolation), pipelined_transaction(conn):
            conn.execute("INSERT INTO pipelined VALUES (1, 'kept only with its commit')")
            conn.execute("INSERT INTO pipelined_deferred VALUES (1, 99)")  # checked at COMMIT
        idle_and_usable(conn)
    assert stored(table) == []


def test_a_connection_the_server_closed_is_closed_for_the_pool_to_drop(table: ConnectionPool) -> None:
    with table.connection() as conn:
        pid = conn.info.backend_pid
        with pytest.raises(psycopg.OperationalError), pipelined_transaction(conn):
            conn.execute("INSERT INTO pipelined VALUES (1, 'lost')")
            with table.connection() as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
            conn.execute("SELECT 1").fetchone()
        assert conn.closed
    assert stored(table) == []


def test_a_read_then_writes_cost_two_round_trips(table: ConnectionPool) -> None:
    with table.connection() as conn:
        for _ in range(3):  # statements prepared: the counted run is the steady state
            with pipelined_transaction(conn):
                conn.execute("SELECT count(*) FROM pipelined").fetchone()
                conn.execute("INSERT INTO pipelined VALUES (%s, 'w') ON CONFLICT (id) DO NOTHING", (1,))
        with RoundTrips(conn) as trips, pipelined_transaction(conn):
            conn.execute("SELECT count(*) FROM pipelined").fetchone()
            conn.execute("INSERT INTO pipelined VALUES (%s, 'w') ON CONFLICT (id) DO NOTHING", (2,))
            conn.execute("UPDATE pipelined SET note = 'x' WHERE id = 1")
        assert trips.count == 2
    assert stored(table) == [(1, "x"), (2, "w")]


def _advisory_lock_held(pool: ConnectionPool, key: int, *, within: float) -> bool:
    """Whether another session holds advisory lock ``key``, looked for until ``within`` seconds pass."""
    deadline = time.monotonic() + within
    with pool.connection() as other:
        other.autocommit = True
        while True:
            held = other.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND granted", (key,)
            ).fetchone()
            if held is not None and held[0] > 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def test_statements_are_written_when_a_result_is_read_and_at_the_end(table: ConnectionPool) -> None:
    """A statement whose result is not read waits in the client's buffer: the server has not seen it until a
    read (which sends everything queued before it) or the transaction's end."""
    with table.connection() as conn:
        with pipelined_transaction(conn):
            conn.execute("SELECT pg_advisory_xact_lock(4242)")
            assert not _advisory_lock_held(table, 4242, within=0.3)  # held back, not on the server yet
            conn.execute("SELECT 1").fetchone()
            assert _advisory_lock_held(table, 4242, within=0)  # sent with the read, and run before it
            conn.execute("INSERT INTO pipelined VALUES (1, 'at the end')")
            conn.execute("SELECT pg_advisory_xact_lock(4343)")
            assert not _advisory_lock_held(table, 4343, within=0.3)
        assert not _advisory_lock_held(table, 4242, within=0)  # committed: the transaction's locks are gone
        idle_and_usable(conn)
    assert stored(table) == [(1, "at the end")]


def test_a_held_back_statement_that_fails_is_raised_at_the_next_read(table: ConnectionPool) -> None:
    """The error of a statement whose result nobody read surfaces at the next read (the statement after it
    is not run), and the transaction is rolled back."""
    with table.connection() as conn:
        conn.execute("INSERT INTO pipelined VALUES (1, 'before')")
        conn.commit()
        reached = False
        with pytest.raises(errors.UniqueViolation), pipelined_transaction(conn):
            conn.execute("INSERT INTO pipelined VALUES (2, 'rolled back')")
            conn.execute("INSERT INTO pipelined VALUES (1, 'duplicate')")  # held back: nothing raised yet
            reached = True
            conn.execute("INSERT INTO pipelined VALUES (3, 'never run') RETURNING id").fetchone()
        assert reached
        idle_and_usable(conn)
    assert stored(table) == [(1, "before")]


def test_writes_larger_than_the_socket_takes_at_once_are_all_sent(table: ConnectionPool) -> None:
    """Held writes past libpq's threshold and the socket's buffer (16 MB here) go out in parts, the server's
    answers read meanwhile, and all of it is committed."""
    note = "x" * 1_000_000
    with table.connection() as conn:
        with pipelined_transaction(conn):
            for key in range(16):
                conn.execute("INSERT INTO pipelined VALUES (%s, %s)", (key, note))
        idle_and_usable(conn)
    rows = stored(table)
    assert [key for key, _ in rows] == list(range(16))
    assert all(value == note for _, value in rows)


def test_a_pipeline_inside_is_psycopg_s_own_and_the_outer_one_still_holds_back(table: ConnectionPool) -> None:
    with table.connection() as conn:
        with pipelined_transaction(conn):
            with conn.pipeline():
                conn.execute("INSERT INTO pipelined VALUES (1, 'inner')")
            conn.execute("SELECT pg_advisory_xact_lock(4444)")
            assert not _advisory_lock_held(table, 4444, within=0.3)
        idle_and_usable(conn)
    assert stored(table) == [(1, "inner")]


def test_a_savepoint_inside_syncs_what_was_held_back_however_large(table: ConnectionPool) -> None:
    """psycopg syncs a pipeline when a transaction (a savepoint here) opens inside it: what was held back
    goes out first, in parts when it is larger than the socket takes at once."""
    note = "y" * 1_000_000
    with table.connection() as conn:
        with pipelined_transaction(conn):
            for key in range(8):
                conn.execute("INSERT INTO pipelined VALUES (%s, %s)", (key, note))
            with conn.transaction():
                conn.execute("INSERT INTO pipelined VALUES (8, 'in the savepoint')")
            with pytest.raises(errors.UniqueViolation), conn.transaction():
                conn.execute("INSERT INTO pipelined VALUES (8, 'a duplicate, rolled back alone')")
        idle_and_usable(conn)
    rows = stored(table)
    assert [key for key, _ in rows] == list(range(9))
    assert rows[8] == (8, "in the savepoint")


def test_every_pipeline_of_the_product_is_a_buffered_one() -> None:
    """psycopg's own pipeline writes once a statement: the product opens its pipelines through
    core.db.buffered_pipeline, which core.db alone builds on ``conn.pipeline()``."""
    root = Path(__file__).resolve().parent.parent
    plain = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("libs", "services", "followups")
        for path in sorted((root / folder).rglob("*.py"))
        if path != root / "libs" / "common" / "core" / "db.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ".pipeline()" in line
    ]
    assert plain == []
