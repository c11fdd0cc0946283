"""The two ``messages``-shaped tables `make bench-partitions` compares, built from the migrated schema.

Both take the columns, defaults, checks and storage options of the real ``messages`` table and every one
of its indexes (read from the catalog of the benchmark's freshly migrated database, so they follow the
migrations), but none of its triggers or foreign keys:

- :data:`FLAT`, as today: one heap, ``PRIMARY KEY (id)``.
- :data:`BY_MONTH`, range-partitioned by month on ``created_at`` (a partition a month, and the next
  month's made in advance), the same indexes made on the partitioned table. A partitioned table's unique
  indexes must include the partition column, so its primary key is ``(id, created_at)`` and the provider
  id's unique index ``(project_id, provider_message_id, created_at)``: neither says any more that an id, or
  a provider id in a project, is unique across months.

Autovacuum is off on both (the benchmark vacuums when it measures a vacuum). The rows are generated from
their number ``g`` alone (ids are ``md5``s of it, so :func:`message_id` and :func:`project_id` name the
same rows from Python); ``created_at`` rises with ``g`` evenly from the start of the month eleven months
back to now, so the heap is in time order as an append-mostly table's is.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from psycopg import Connection, sql

#: The unpartitioned table and the partitioned one.
FLAT: Final = "messages_flat"
BY_MONTH: Final = "messages_by_month"
#: Projects the rows are spread over, and contacts in each.
PROJECTS: Final = 100
CONTACTS: Final = 2_000
#: Months of history (the current one included).
MONTHS: Final = 12
#: Rows per INSERT of the load.
LOAD_CHUNK: Final = 1_000_000
#: The load session's memory for sorts and index builds.
LOAD_MEMORY: Final = "1GB"

#: One message per ``g``: 30% a contact's (inbound), 30% follow-ups, 10% each of rules, campaigns,
#: people and the API; a provider id on each; outbound ones mostly delivered or read, a few failed.
GENERATE: Final = """
INSERT INTO {table} (
    id, project_id, contact_id, conversation_id, number_id, direction, status, source, priority, body,
    provider_message_id, followup_enrollment_id, followup_step_index, sequence_id, sequence_version,
    rule_id, rule_execution_id, campaign_id, template_name, template_language, template_parameters, error,
    error_code, created_at, status_changed_at
)
SELECT md5('m' || g)::uuid, md5('p' || r.project)::uuid, md5('c' || r.project || '.' || r.contact)::uuid,
       md5('v' || r.project || '.' || r.contact)::uuid,
       CASE WHEN r.kind >= 3 THEN md5('n' || r.project)::uuid END,
       CASE WHEN r.kind < 3 THEN 'inbound' ELSE 'outbound' END,
       CASE WHEN r.kind < 3 THEN 'RECEIVED' WHEN r.state = 0 THEN 'FAILED' WHEN r.state < 4 THEN 'SENT'
            WHEN r.state < 11 THEN 'DELIVERED' ELSE 'READ' END,
       (ARRAY['contact', 'contact', 'contact', 'followup', 'followup', 'followup', 'rule', 'campaign',
              'human', 'api'])[r.kind + 1],
       5, 'Hi! A word about your order ' || g || ': reply YES to confirm it, or STOP to hear no more.',
       'wamid.' || md5('w' || g),
       CASE WHEN r.kind BETWEEN 3 AND 5 THEN md5('e' || r.project || '.' || r.contact)::uuid END,
       CASE WHEN r.kind BETWEEN 3 AND 5 THEN g %% 4 END,
       CASE WHEN r.kind BETWEEN 3 AND 5 THEN md5('s' || r.project || '.' || g %% 5)::uuid END,
       CASE WHEN r.kind BETWEEN 3 AND 5 THEN 1 END,
       CASE WHEN r.kind = 6 THEN md5('r' || r.project || '.' || g %% 20)::uuid END,
       CASE WHEN r.kind = 6 THEN md5('x' || g)::uuid END,
       CASE WHEN r.kind = 7 THEN md5('k' || r.project || '.' || g %% 3)::uuid END,
       CASE WHEN r.kind = 7 THEN 'order_update' END, CASE WHEN r.kind = 7 THEN 'en' END,
       CASE WHEN r.kind = 7 THEN '["Ada"]'::jsonb END,
       CASE WHEN r.kind >= 3 AND r.state = 0 THEN 'provider refused the message' END,
       CASE WHEN r.kind >= 3 AND r.state = 0 THEN '131026' END,
       r.at, r.at + interval '5 seconds'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
CROSS JOIN LATERAL (
    SELECT g %% {projects} AS project, (g / {projects}) %% {contacts} AS contact,
           (hashint8(g) & 1023) %% 10 AS kind, (hashint8(g) >> 10) & 15 AS state,
           %(start)s::timestamptz + (g - 1) * %(step)s::interval AS at
) r
"""


def _md5_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(hashlib.md5(text.encode()).hexdigest())


def message_id(g: int) -> uuid.UUID:
    """The id of message ``g`` (as :data:`GENERATE` makes it)."""
    return _md5_uuid(f"m{g}")


def project_id(project: int) -> uuid.UUID:
    """The id of project ``project`` (0 to :data:`PROJECTS` - 1)."""
    return _md5_uuid(f"p{project}")


def project_of(g: int) -> uuid.UUID:
    """The project of message ``g``."""
    return project_id(g % PROJECTS)


def contact_of(project: int, contact: int) -> uuid.UUID:
    return _md5_uuid(f"c{project}.{contact}")


def conversation_of(project: int, contact: int) -> uuid.UUID:
    return _md5_uuid(f"v{project}.{contact}")


def month_start(at: datetime, months_back: int = 0) -> datetime:
    """The first instant (UTC) of the month ``months_back`` months before ``at``'s (negative: after)."""
    index = at.year * 12 + at.month - 1 - months_back
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class History:
    """Where the generated rows lie in time."""

    rows: int
    #: The first row's time (the oldest month's start) and the spacing of the rows.
    start: datetime
    step: timedelta

    def created_at(self, g: int) -> datetime:
        return self.start + (g - 1) * self.step

    @property
    def oldest_month_end(self) -> datetime:
        """The end of the oldest month: what is removed is older than this."""
        return month_start(self.start, -1)

    def months(self) -> Iterator[tuple[datetime, datetime]]:
        """Each month's bounds, the oldest first: the history's and the next month (made in advance)."""
        for k in range(MONTHS + 1):
            yield month_start(self.start, -k), month_start(self.start, -k - 1)


def history(rows: int, now: datetime) -> History:
    """``rows`` spread evenly from the start of the month :data:`MONTHS` - 1 months back to ``now``."""
    start = month_start(now, MONTHS - 1)
    return History(rows, start, (now - start) / rows)


def partition_name(lower: datetime) -> str:
    return f"{BY_MONTH}_{lower:%Y_%m}"


def build(conn: Connection[Any], h: History, *, report: bool = True) -> None:
    """Both tables, loaded with the same ``h.rows`` rows, indexed, vacuumed and analysed (autocommit)."""
    conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(LOAD_MEMORY)))
    conn.execute("SET synchronous_commit = off")  # the load's own commits: not what is measured
    options = _storage_options(conn)
    conn.execute(
        sql.SQL("CREATE TABLE {} (LIKE messages INCLUDING ALL EXCLUDING INDEXES)").format(
            sql.Identifier(FLAT)
        )
    )
    conn.execute(sql.SQL("ALTER TABLE {} SET ({})").format(sql.Identifier(FLAT), options))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (LIKE messages INCLUDING ALL EXCLUDING INDEXES) PARTITION BY RANGE (created_at)"
        ).format(sql.Identifier(BY_MONTH))
    )
    for lower, upper in h.months():
        name = sql.Identifier(partition_name(lower))
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                name, sql.Identifier(BY_MONTH), sql.Literal(lower), sql.Literal(upper)
            )
        )
        conn.execute(sql.SQL("ALTER TABLE {} SET ({})").format(name, options))
    generate = sql.SQL(GENERATE).format(
        table=sql.Identifier(FLAT), projects=sql.Literal(PROJECTS), contacts=sql.Literal(CONTACTS)
    )
    started = time.perf_counter()
    for first in range(1, h.rows + 1, LOAD_CHUNK):
        last = min(h.rows, first + LOAD_CHUNK - 1)
        conn.execute(generate, {"first": first, "last": last, "start": h.start, "step": h.step})
        if report:
            print(f"    {FLAT}: {last} rows, {time.perf_counter() - started:.0f} s", flush=True)
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT * FROM {}").format(sql.Identifier(BY_MONTH), sql.Identifier(FLAT))
    )
    if report:
        print(f"    {BY_MONTH}: copied, {time.perf_counter() - started:.0f} s", flush=True)
    for table in (FLAT, BY_MONTH):
        for statement in index_statements(conn, table, partitioned=table == BY_MONTH):
            conn.execute(statement)
        if report:
            print(f"    {table}: indexed, {time.perf_counter() - started:.0f} s", flush=True)
    for table in (FLAT, BY_MONTH):
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
    if report:
        print(f"    vacuumed and analysed, {time.perf_counter() - started:.0f} s", flush=True)


def _storage_options(conn: Connection[Any]) -> sql.Composed:
    """The real table's storage options (fillfactor, autovacuum thresholds), with autovacuum off."""
    row = conn.execute(
        "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'messages'::regclass"
    ).fetchone()
    assert row is not None
    options = [option for option in row[0] if not option.startswith("autovacuum_enabled=")]
    return sql.SQL(", ").join(sql.SQL(option) for option in [*options, "autovacuum_enabled = false"])


#: The key columns of an index definition (``USING btree (a, b DESC)``).
_KEY_COLUMNS: Final = re.compile(r"USING (\w+) \(([^()]*)\)")


def index_statements(conn: Connection[Any], table: str, *, partitioned: bool) -> list[sql.SQL | sql.Composed]:
    """The real ``messages`` indexes (its primary key as a primary key), made on ``table``; on the
    partitioned one each unique key gains ``created_at``, as PostgreSQL requires."""
    rows = conn.execute(
        """
        SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary, i.indisunique
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'messages'::regclass ORDER BY c.relname
        """
    ).fetchall()
    statements: list[sql.SQL | sql.Composed] = []
    for name, definition, primary, unique in rows:
        key = _KEY_COLUMNS.search(definition)
        assert key is not None, definition
        columns = key.group(2)
        if unique and partitioned and "created_at" not in columns.split(", "):
            columns += ", created_at"
        if primary:
            statements.append(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
                    sql.Identifier(table), sql.Identifier(f"{table}_pkey"), sql.SQL(columns)
                )
            )
            continue
        own = name.replace("messages", table, 1)
        head, _, rest = definition.partition(" ON public.messages USING ")
        assert rest, definition
        head = head.replace(name, own, 1)
        rest = rest.replace(f"({key.group(2)})", f"({columns})", 1)
        statements.append(sql.SQL(f"{head} ON public.{table} USING {rest}"))
    return statements
