"""JSON to and from PostgreSQL goes through msgspec (libs.common.core.db): the values read and written are
the standard library's, and a value msgspec refuses to read still reads."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.core.db import json_loads

VALUES: list[Any] = [
    {"name": "Zoë", "emoji": "👋", "n": 123456789012345678901234567890, "x": 1.5, "none": None},
    [1, "two", [3.25, {"four": False}]],
    "plain",
    -7,
]


@pytest.mark.parametrize("value", VALUES)
def test_a_value_written_and_read_back_is_the_standard_librarys(pool: ConnectionPool, value: Any) -> None:
    with pool.connection() as conn:
        row = conn.execute("SELECT %s::jsonb, %s::jsonb::text", (Jsonb(value), Jsonb(value))).fetchone()
    assert row is not None
    assert row[0] == value == json.loads(row[1])


def test_uuids_and_times_are_written_as_their_json_strings(pool: ConnectionPool) -> None:
    an_id, at = uuid.uuid4(), datetime(2026, 12, 6, 1, 2, 3, tzinfo=UTC)
    with pool.connection() as conn:
        row = conn.execute("SELECT %s::jsonb", (Jsonb({"id": an_id, "at": at}),)).fetchone()
    assert row is not None
    assert row[0] == {"id": str(an_id), "at": "2026-12-06T01:02:03Z"}


def test_a_number_beyond_a_float_reads_as_the_standard_library_reads_it(pool: ConnectionPool) -> None:
    # jsonb keeps it (a numeric: 400 digits, then .5); msgspec refuses it: the reader falls back rather
    # than fail on the row
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT jsonb_build_object('huge', 1e400 + 0.5, 'whole', 1e400, 'small', 2)"
        ).fetchone()
    assert row is not None
    assert row[0] == {"huge": math.inf, "whole": 10**400, "small": 2}
    assert json_loads(b"[1e400]") == [math.inf] == json.loads(b"[1e400]")
