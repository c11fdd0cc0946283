"""core.queued: statements queued straight into a connection's pipeline. Their rows and errors are a
cursor's, in a pipeline and outside one; each is prepared once per connection by psycopg's own preparation
cache, so a rollback or a drop (psycopg deallocates everything then) prepares it again instead of failing
on a statement the server no longer holds; and the transaction still costs the reads' round trips plus
one."""

from __future__ import annotations

import gc
import uuid
import weakref
from datetime import UTC, datetime
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import errors
from psycopg.pq.abc import PGresult
from psycopg.rows import RowMaker
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.core import queued
from libs.common.core.db import buffered_pipeline, pipelined_transaction
from libs.common.core.queued import queue_command, queue_write, read_row
from libs.common.core.sql import numbered
from tests.helpers import RoundTrips

TABLE = """
CREATE TABLE IF NOT EXISTS queued_probe (
    id integer PRIMARY KEY,
    key uuid NOT NULL,
    at timestamptz,
    data jsonb,
    tags text[]
)
"""
INSERT = (
    "INSERT INTO queued_probe (id, key, at, data, tags) VALUES (%(id)s, %(key)s, %(at)s, %(data)s, %(tags)s)"
)
READ = "SELECT id, key, at, data, tags, %(id)s::int + 1 AS next FROM queued_probe WHERE id = %(id)s"
KEY = uuid.UUID("00000000-0000-4000-8000-000000000001")
AT = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.fixture
def table(pool: ConnectionPool) -> ConnectionPool:
    with pool.connection() as conn:
        conn.execute(TABLE)
    return pool


def as_dict(result: PGresult) -> RowMaker[dict[str, Any]]:
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return lambda values: dict(zip(names, values, strict=True))


def params(id: int) -> dict[str, Any]:
    return {"id": id, "key": KEY, "at": AT, "data": Jsonb({"n": id}), "tags": ["a", "b"]}


def expected(id: int) -> dict[str, Any]:
    return {"id": id, "key": KEY, "at": AT, "data": {"n": id}, "tags": ["a", "b"], "next": id + 1}


def test_in_a_pipeline_and_outside_one_a_statement_writes_and_reads_what_a_cursor_would(
    table: ConnectionPool,
) -> None:
    with table.connection() as conn:
        with pipelined_transaction(conn):
            queue_write(conn, INSERT, params(1))
            assert read_row(conn, READ, {"id": 1}, as_dict) == expected(1)
            assert read_row(conn, READ, {"id": 99}, as_dict) is None
        queue_write(conn, INSERT, params(2))  # no pipeline: at once, in the connection's transaction
        assert read_row(conn, READ, {"id": 2}, as_dict) == expected(2)
        conn.commit()
        cursor_rows = conn.execute("SELECT id, key, at, data, tags FROM queued_probe ORDER BY id").fetchall()
    assert cursor_rows == [(1, KEY, AT, {"n": 1}, ["a", "b"]), (2, KEY, AT, {"n": 2}, ["a", "b"])]


def test_a_failing_queued_write_is_raised_at_the_next_read_and_nothing_is_kept(table: ConnectionPool) -> None:
    with table.connection() as conn:
        with pytest.raises(errors.UniqueViolation), pipelined_transaction(conn):
            queue_write(conn, INSERT, params(1))
            queue_write(conn, INSERT, params(1))  # held back: raised at the read below
            read_row(conn, READ, {"id": 1}, as_dict)
        with pytest.raises(errors.UniqueViolation), pipelined_transaction(conn):
            queue_write(conn, INSERT, params(3))
            queue_write(conn, INSERT, params(3))  # raised at the end, with the COMMIT not run
        assert conn.execute("SELECT count(*) FROM queued_probe").fetchone() == (0,)


def prepared(conn: psycopg.Connection[Any], statement: LiteralString) -> list[int]:
    """How often each of the connection's prepared statements of ``statement`` ran (as sent: numbered)."""
    rows = conn.execute(
        "SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE statement = %s",
        (numbered(statement).text,),
    ).fetchall()
    return [executions for (executions,) in rows]


def test_a_statement_is_prepared_once_per_connection_and_again_after_psycopg_deallocates(
    table: ConnectionPool,
) -> None:
    with table.connection() as conn:
        for id in range(1, 4):
            with pipelined_transaction(conn):
                queue_write(conn, INSERT, params(id))
                read_row(conn, READ, {"id": id}, as_dict)
        assert prepared(conn, INSERT) == [3] and prepared(conn, READ) == [3]
        conn.rollback()
        # a rollback of a transaction in which psycopg prepared makes it deallocate everything on the
        # connection (ours too): the next use prepares again instead of failing
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("SELECT 1", prepare=True)
            raise RuntimeError("rolled back")
        conn.execute("SELECT 1", prepare=True)  # psycopg sends its deallocation before this one
        assert prepared(conn, INSERT) == []
        conn.rollback()
        with pipelined_transaction(conn):
            queue_write(conn, INSERT, params(4))
            assert read_row(conn, READ, {"id": 4}, as_dict) == expected(4)
        assert prepared(conn, INSERT) == [1]
        conn.rollback()


def test_a_statement_the_server_refuses_to_prepare_is_not_taken_for_prepared(table: ConnectionPool) -> None:
    bad = "SELECT no_such_column FROM queued_probe WHERE id = %(id)s"
    with table.connection() as conn:
        for _ in range(2):  # the same error both times (not "prepared statement does not exist")
            with pytest.raises(errors.UndefinedColumn), pipelined_transaction(conn):
                read_row(conn, bad, {"id": 1}, as_dict)


def test_values_of_other_types_are_prepared_apart(table: ConnectionPool) -> None:
    """A parameter null in one execution and set in the next is prepared for each (its type differs), as
    psycopg keys its own statements."""
    with table.connection() as conn:
        with pipelined_transaction(conn):
            queue_write(conn, INSERT, params(1) | {"at": None})
            queue_write(conn, INSERT, params(2))
        rows = conn.execute("SELECT id, at FROM queued_probe ORDER BY id").fetchall()
        assert rows == [(1, None), (2, AT)]
        assert prepared(conn, INSERT) == [1, 1]
        conn.rollback()


def test_begin_and_commit_and_the_statements_cost_the_reads_round_trips_plus_one(
    table: ConnectionPool,
) -> None:
    with table.connection() as conn:
        with pipelined_transaction(conn):
            queue_write(conn, INSERT, params(1))
        with RoundTrips(conn) as trips, pipelined_transaction(conn):
            read_row(conn, READ, {"id": 1}, as_dict)
            queue_write(conn, INSERT, params(2))
            queue_write(conn, "UPDATE queued_probe SET tags = %(tags)s WHERE id = 1", {"tags": ["x"]})
        assert trips.count == 2
        assert conn.execute("SELECT id, tags FROM queued_probe ORDER BY id").fetchall() == [
            (1, ["x"]),
            (2, ["a", "b"]),
        ]


def test_a_command_outside_a_pipeline_runs_at_once(table: ConnectionPool) -> None:
    with table.connection() as conn:
        conn.autocommit = True
        queue_command(conn, "BEGIN")
        queue_write(conn, INSERT, params(1))
        queue_command(conn, "ROLLBACK")
        assert conn.execute("SELECT count(*) FROM queued_probe").fetchone() == (0,)
        with buffered_pipeline(conn):
            queue_command(conn, "BEGIN")
            queue_write(conn, INSERT, params(1))
            queue_command(conn, "COMMIT")
        assert conn.execute("SELECT count(*) FROM queued_probe").fetchone() == (1,)
        conn.autocommit = False


def test_what_is_kept_for_a_connection_does_not_keep_it_alive(server_url: str) -> None:
    conn = psycopg.connect(server_url, autocommit=True)
    with buffered_pipeline(conn):
        assert read_row(conn, "SELECT %(n)s::int AS n", {"n": 1}, as_dict) == {"n": 1}
    assert conn in queued._CONNECTIONS
    gone = weakref.ref(conn)
    conn.close()
    del conn
    gc.collect()
    assert gone() is None
