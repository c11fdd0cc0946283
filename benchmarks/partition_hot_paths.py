"""`make bench-partitions`'s hot paths: what partitioning messages by month costs an insert of a new message
and a lookup of one by (project_id, id), on the two tables of :mod:`benchmarks.partition_tables` (see
:mod:`benchmarks.partitions`)."""

from __future__ import annotations

import random
import re
import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import psycopg
from psycopg import sql

from benchmarks.partition_tables import (
    BY_MONTH,
    CONTACTS,
    FLAT,
    PROJECTS,
    History,
    contact_of,
    conversation_of,
    message_id,
    project_id,
    project_of,
)

#: Operations run before a hot-path measure starts timing (the connection's caches warm, its statements
#: prepared, as a pooled connection's are).
WARM_UP: Final = 100

#: A new message for the current month (the release path's insert_queued_message, its columns).
INSERT: Final = """
INSERT INTO {table} (id, project_id, contact_id, conversation_id, number_id, direction, status, source,
                     priority, body, followup_enrollment_id, followup_step_index, sequence_id,
                     sequence_version, created_at, status_changed_at)
VALUES (%(id)s, %(project_id)s, %(contact_id)s, %(conversation_id)s, %(number_id)s, 'outbound', 'QUEUED',
        'followup', 5, 'Hello again: is your order still on its way?', %(enrollment_id)s, 1, %(sequence_id)s,
        1, now(), now())
"""
#: A message by (project_id, id), as the API and the send lane find one: no created_at.
LOOKUP: Final = "SELECT id, status, created_at FROM {table} WHERE project_id = %(project_id)s AND id = %(id)s"
#: The same knowing created_at to the second (what an id that encodes its time would give).
LOOKUP_KNOWN_TIME: Final = LOOKUP + " AND created_at >= %(low)s AND created_at < %(high)s"


def query(text: str, table: str, **literals: Any) -> sql.Composed:
    """``text`` with its ``{table}`` and other ``{name}`` fields filled in."""
    return sql.SQL(text).format(
        table=sql.Identifier(table), **{k: sql.Literal(v) for k, v in literals.items()}
    )


def new_message(rng: random.Random) -> dict[str, Any]:
    """The parameters of :data:`INSERT`: a follow-up message to one of the generated contacts."""
    project, contact = rng.randrange(PROJECTS), rng.randrange(CONTACTS)
    return {
        "id": uuid.uuid4(),
        "project_id": project_id(project),
        "contact_id": contact_of(project, contact),
        "conversation_id": conversation_of(project, contact),
        "number_id": uuid.uuid5(uuid.NAMESPACE_OID, f"n{project}"),
        "enrollment_id": uuid.uuid4(),
        "sequence_id": uuid.uuid5(uuid.NAMESPACE_OID, f"s{project}"),
    }


def insert_rate(url: str, table: str, count: int) -> float:
    """New messages inserted a statement a transaction (synchronous_commit off): rows/s."""
    rng = random.Random(7)
    rows = [new_message(rng) for _ in range(count)]
    statement = query(INSERT, table)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        for _ in range(WARM_UP):
            conn.execute(statement, new_message(rng))
        started = time.perf_counter()
        for row in rows:
            conn.execute(statement, row)
        return count / (time.perf_counter() - started)


def _lookup_params(h: History, g: int) -> dict[str, Any]:
    at = h.created_at(g)
    return {
        "project_id": project_of(g),
        "id": message_id(g),
        "low": at - timedelta(seconds=1),
        "high": at + timedelta(seconds=1),
    }


def lookup_rate(
    url: str, table: str, params: list[dict[str, Any]], *, known_time: bool, generic: bool = False
) -> float:
    """Existing messages found by (project_id, id) (and created_at to the second when ``known_time``),
    each found: lookups/s. The statement is prepared after a few runs (psycopg's default) and PostgreSQL's
    plan cache chooses its plan, or keeps one generic plan when ``generic``."""
    statement = query(LOOKUP_KNOWN_TIME if known_time else LOOKUP, table)
    with psycopg.connect(url, autocommit=True) as conn:
        if generic:
            conn.execute("SET plan_cache_mode = force_generic_plan")
        for p in params[-WARM_UP:]:
            conn.execute(statement, p).fetchall()
        started = time.perf_counter()
        for p in params:
            found = conn.execute(statement, p).fetchall()
            assert len(found) == 1, f"{p['id']} found {len(found)} times in {table}"
        return len(params) / (time.perf_counter() - started)


def partition_scans(url: str, table: str, p: dict[str, Any], *, known_time: bool) -> int:
    """The scans in the lookup's plan (one a partition, on the partitioned table)."""
    statement = query(LOOKUP_KNOWN_TIME if known_time else LOOKUP, table)
    with psycopg.connect(url, autocommit=True) as conn:
        plan = conn.execute(sql.SQL("EXPLAIN (COSTS OFF) ") + statement, p).fetchall()
    return sum(1 for (line,) in plan if re.search(r"Scan (using \S+ )?on ", line))


@dataclass
class HotPaths:
    #: Per table: median inserts/s, lookups/s, lookups/s knowing the time (with the plan cache's choice,
    #: and with a generic plan).
    inserts: dict[str, float]
    lookups: dict[str, float]
    lookups_known_time: dict[str, float]
    lookups_known_time_generic: dict[str, float]


def hot_paths(url: str, h: History, ops: int, rounds: int) -> HotPaths:
    """Each measure ``rounds`` times, the tables in turn; the medians."""
    rng = random.Random(26)
    params = [_lookup_params(h, rng.randint(1, h.rows)) for _ in range(ops)]
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for table in (FLAT, BY_MONTH):
            runs.setdefault(("insert", table), []).append(insert_rate(url, table, ops))
            runs.setdefault(("lookup", table), []).append(lookup_rate(url, table, params, known_time=False))
            runs.setdefault(("known", table), []).append(lookup_rate(url, table, params, known_time=True))
            runs.setdefault(("generic", table), []).append(
                lookup_rate(url, table, params, known_time=True, generic=True)
            )

    def medians(kind: str) -> dict[str, float]:
        return {table: statistics.median(runs[kind, table]) for table in (FLAT, BY_MONTH)}

    return HotPaths(medians("insert"), medians("lookup"), medians("known"), medians("generic"))


def print_hot_paths(url: str, h: History, hot: HotPaths) -> tuple[float, float]:
    """The hot paths' figures; returns the insert and lookup ratios (partitioned over flat)."""
    sample = _lookup_params(h, h.rows // 2)
    scans = {
        (table, known): partition_scans(url, table, sample, known_time=known)
        for table in (FLAT, BY_MONTH)
        for known in (False, True)
    }

    def ratio(rates: dict[str, float]) -> str:
        flat, by_month = rates[FLAT], rates[BY_MONTH]
        return f"{FLAT} {flat:.0f}/s, {BY_MONTH} {by_month:.0f}/s: ratio {by_month / flat:.2f}"

    print(f"  inserts (synchronous_commit off): {ratio(hot.inserts)}")
    print(
        f"  lookup by (project_id, id), the plan scanning {scans[FLAT, False]} and"
        f" {scans[BY_MONTH, False]} partitions: {ratio(hot.lookups)}"
    )
    print(
        f"  the same knowing created_at (an id encoding its time), the plan scanning {scans[FLAT, True]} and"
        f" {scans[BY_MONTH, True]} partition: {ratio(hot.lookups_known_time)};"
        f" with a generic plan: {ratio(hot.lookups_known_time_generic)}",
        flush=True,
    )
    return hot.inserts[BY_MONTH] / hot.inserts[FLAT], hot.lookups[BY_MONTH] / hot.lookups[FLAT]
