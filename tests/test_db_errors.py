"""Driver errors at the database boundary: what is the input's fault, what is an outage."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.db import map_errors, server_unavailable
from libs.common.core.errors import DatabaseUnavailable, InvalidInput


def test_a_value_too_large_for_an_index_is_invalid_input_not_an_outage(pool: ConnectionPool) -> None:
    # Given a table with a b-tree index, and a value over the index row's size limit (incompressible)
    with pool.connection() as conn:
        conn.execute("CREATE TABLE big (v text)")
        conn.execute("CREATE INDEX big_v_idx ON big (v)")
    # When it is written, the error is the input's (a 422), not "database unavailable" (a 503)
    with pytest.raises(InvalidInput, match="too large"), map_errors(), pool.connection() as conn:
        conn.execute("INSERT INTO big VALUES (%s)", (secrets.token_hex(4000),))


def test_an_unreachable_server_is_unavailable() -> None:
    with pytest.raises(DatabaseUnavailable), map_errors():
        psycopg.connect("postgresql://nobody@127.0.0.1:1/none", connect_timeout=2)


@pytest.mark.parametrize(
    ("error", "unavailable"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.ConnectionFailure("connection failure"), True),
        (psycopg.errors.ProgramLimitExceeded("index row size exceeds maximum"), False),
        (psycopg.errors.DeadlockDetected("deadlock detected"), False),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
        (RuntimeError("a bug"), False),
    ],
)
def test_only_a_lost_or_refused_connection_means_the_server_is_unavailable(
    error: Exception, unavailable: bool
) -> None:
    assert server_unavailable(error) is unavailable
