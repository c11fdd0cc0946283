"""`make bench-partitions`: removing the oldest month of messages by batched deletes (retention's way) or by
dropping a month's partition, and what partitioning by month costs the hot paths (issue 26).

In a database of its own, :mod:`benchmarks.partition_tables` builds two tables with the real ``messages``
columns and indexes holding the same N rows (default 10,000,000) spread over 12 months and 100 projects:
``messages_flat`` as today, and ``messages_by_month`` range-partitioned by month on ``created_at`` (its
primary key ``(id, created_at)``). Then:

1. The hot paths, R rounds taking the tables in turn (a slow spell of the machine falls on both alike), the
   median of each: single-row inserts of new messages (QUEUED, this month, a random id as the product
   makes them), a statement a transaction with synchronous_commit off (the table's cost, not the disk's
   flush); and lookups of existing messages by (project_id, id), the API's and the send lane's shape, which
   carries no ``created_at``: the partitioned table has to probe every month's primary key (the partitions
   the plan scans are printed). The same lookup knowing ``created_at`` to the second, as an id that encodes
   its time (a UUIDv7) would allow, is measured too: with the plan the plan cache chooses (on PostgreSQL 15
   it keeps making a custom plan, pruned when planned: a generic plan's estimate counts every partition),
   and with a generic plan forced (pruned when it starts).
2. For each table in turn: a workload alone for W seconds (the baseline), then the same workload while the
   oldest month goes:
   - ``messages_flat``: retention's way (``libs/common/retention``): batches of at most ``BATCH`` (5,000)
     rows picked through an index and deleted by primary key, a transaction each, resting ``PAUSE_RATIO``
     times as long as the batch took, until a batch comes back short. ``messages`` has no index led by
     ``created_at``, and a retention period is a project's (``retention_days``), so the batches go project
     by project through the (project_id, created_at) index. Then a VACUUM, the workload stopped (its time
     and WAL apart; it returns no space to the system, only to later inserts).
   - ``messages_by_month``: ``ALTER TABLE ... DETACH PARTITION ... CONCURRENTLY``, then ``DROP TABLE``.
   The workload is one thread at a steady 200 operations a second, in turn inserting a new message for the
   current month (autocommit, synchronous commit) and reading a project's 50 newest messages through its
   (project_id, created_at) index, as the release path and the API do. Its p99 is over the operations
   started from the removal's start until it ended, or for at least W seconds (a drop lasts a moment: its
   p99 then covers what follows it, such as plans made anew); each operation's own time is counted
   (an operation that could not start on time is not). The WAL: ``pg_wal_lsn_diff`` over the removal is
   the whole server's, so it includes the workload's inserts meanwhile (their rate alone is printed with
   each baseline: full-page images of the flat table's large indexes make it several MB/s) and anything
   else the server does; the deletes' own WAL is therefore taken from each batch run as
   ``EXPLAIN (ANALYZE, WAL)`` (the statement runs as it would, and reports its WAL bytes). A detach and a
   drop write almost nothing: theirs is the lsn difference, an upper bound.

The machine's other work makes every figure noisy. The last line is `partitions: rows=<n> delete_s=<s>
drop_s=<s> delete_wal_mb=<n> drop_wal_mb=<n> delete_p99_ms=<n> drop_p99_ms=<n> baseline_p99_ms=<n>
insert_ratio=<r> lookup_ratio=<r>`, where the baseline is the workload alone on ``messages_flat`` (the
partitioned table's is printed above it) and the ratios are the partitioned table's rate over the
unpartitioned one's (below 1: partitioning is slower).
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
from psycopg import sql

from benchmarks.common import bench_database, percentile
from benchmarks.partition_hot_paths import INSERT, hot_paths, new_message, print_hot_paths, query
from benchmarks.partition_tables import BY_MONTH, FLAT, PROJECTS, build, history, partition_name, project_id
from libs.common.retention.cleanup import BATCH, PAUSE_RATIO

BENCH_DATABASE = "followups_bench_partitions"

#: The workload's operations a second (inserts and reads in turn).
WORKLOAD_RATE: Final = 200
#: The newest messages a read returns.
RECENT: Final = 50
#: How long the workload runs before the removal starts (s).
LEAD: Final = 1.0
#: A project's newest messages (the API's list_messages without filters).
RECENT_MESSAGES: Final = """
SELECT id, contact_id, status, body, created_at FROM {table}
WHERE project_id = %(project_id)s ORDER BY created_at DESC, id DESC LIMIT {limit}
"""
#: Retention's batch shape (``followups/transitions.sql::finished_enrollments``), a project at a time.
DELETE_BATCH: Final = """
DELETE FROM {table}
WHERE id = ANY(ARRAY(
    SELECT id FROM {table}
    WHERE project_id = %(project_id)s AND created_at < %(cutoff)s
    ORDER BY created_at
    LIMIT %(limit)s
))
"""


class Workload:
    """Inserts and reads in turn at :data:`WORKLOAD_RATE` a second, in a thread of its own, until
    finished; each operation's (start, latency s)."""

    def __init__(self, url: str, table: str) -> None:
        self.url, self.table = url, table
        self.samples: list[tuple[float, float]] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        rng = random.Random(26)
        insert = query(INSERT, self.table)
        read = query(RECENT_MESSAGES, self.table, limit=RECENT)
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                due, n = time.perf_counter(), 0
                while not self.halt.is_set():
                    wait = due - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    started = time.perf_counter()
                    if n % 2 == 0:
                        conn.execute(insert, new_message(rng))
                    else:
                        conn.execute(read, {"project_id": project_id(rng.randrange(PROJECTS))}).fetchall()
                    self.samples.append((started, time.perf_counter() - started))
                    n += 1
                    # a steady pace, no burst to catch up after a stall
                    due = max(due + 1 / WORKLOAD_RATE, started)
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def finish(self) -> None:
        self.halt.set()
        self.thread.join()
        if self.error is not None:
            raise SystemExit(f"the workload failed: {self.error!r}")

    def latencies(self, start: float, end: float) -> list[float]:
        return [latency for at, latency in self.samples if start <= at < end]


def _lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _wal_mb(conn: psycopg.Connection[Any], since: str) -> float:
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (since,)).fetchone()
    assert row is not None
    return float(row[0]) / 2**20


def size_mb(conn: psycopg.Connection[Any], table: str) -> float:
    """Heap, TOAST and indexes of ``table`` (of every partition, for a partitioned one)."""
    row = conn.execute(
        """
        SELECT sum(pg_total_relation_size(t.relid))
        FROM (SELECT relid FROM pg_partition_tree(%(table)s::regclass) UNION SELECT %(table)s::regclass) t
        """,
        {"table": table},
    ).fetchone()
    assert row is not None
    return float(row[0]) / 2**20


@dataclass
class Removal:
    rows: int
    #: Wall time (s), and the part of it spent in statements (the rest is retention's rests).
    seconds: float
    busy: float
    #: The removal's own WAL when its statements report it (MB).
    own_wal_mb: float | None = None


@dataclass
class Measured:
    removal: Removal
    #: The whole server's WAL over the removal (MB).
    server_wal_mb: float
    p99_ms: float
    max_ms: float
    ops_per_s: float


@dataclass
class Baseline:
    p99_ms: float
    max_ms: float
    ops_per_s: float
    wal_mb_per_s: float


def delete_month(url: str, cutoff: datetime) -> Removal:
    """Retention's way on :data:`~benchmarks.partition_tables.FLAT`: a project at a time, batches of
    :data:`BATCH`, each its own transaction, resting after each full one, until a batch comes back short."""
    statement = sql.SQL("EXPLAIN (ANALYZE, WAL, TIMING OFF, SUMMARY OFF, FORMAT JSON) ") + query(
        DELETE_BATCH, FLAT
    )
    rows, busy, wal, started = 0, 0.0, 0, time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for project in range(PROJECTS):
            while True:
                batch_started = time.perf_counter()
                row = conn.execute(
                    statement, {"project_id": project_id(project), "cutoff": cutoff, "limit": BATCH}
                ).fetchone()
                took = time.perf_counter() - batch_started
                assert row is not None
                plan = row[0][0]["Plan"]
                # the rows the delete was fed (its outer plan), and the WAL of the whole statement
                deleted = next(
                    int(p["Actual Rows"]) for p in plan["Plans"] if p["Parent Relationship"] == "Outer"
                )
                rows, busy, wal = rows + deleted, busy + took, wal + int(plan["WAL Bytes"])
                if deleted < BATCH:
                    break
                time.sleep(took * PAUSE_RATIO)
    return Removal(rows, time.perf_counter() - started, busy, wal / 2**20)


def drop_month(url: str, partition: str) -> Removal:
    """The oldest month's partition detached (concurrently: the workload's statements go on) and dropped."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(partition))).fetchone()
        assert row is not None
        started = time.perf_counter()
        conn.execute(
            sql.SQL("ALTER TABLE {} DETACH PARTITION {} CONCURRENTLY").format(
                sql.Identifier(BY_MONTH), sql.Identifier(partition)
            )
        )
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(partition)))
        elapsed = time.perf_counter() - started
    return Removal(int(row[0]), elapsed, elapsed)


def _checkpoint(url: str) -> None:
    """Each run starts with the data files flushed (and pays its own full-page images)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def run_baseline(url: str, table: str, window: float) -> Baseline:
    """The workload alone for ``window`` seconds."""
    _checkpoint(url)
    with psycopg.connect(url, autocommit=True) as conn:
        workload = Workload(url, table)
        since = _lsn(conn)
        started = time.perf_counter()
        workload.start()
        time.sleep(window)
        workload.finish()
        elapsed = time.perf_counter() - started
        wal = _wal_mb(conn, since)
    latencies = workload.latencies(started, started + elapsed)
    return Baseline(
        percentile(latencies, 99) * 1000, max(latencies) * 1000, len(latencies) / elapsed, wal / elapsed
    )


def run_removal(url: str, table: str, remove: Callable[[], Removal], window: float) -> Measured:
    """The workload on ``table`` while ``remove`` runs (started :data:`LEAD` s after the workload)."""
    _checkpoint(url)
    with psycopg.connect(url, autocommit=True) as conn:
        workload = Workload(url, table)
        workload.start()
        time.sleep(LEAD)
        since = _lsn(conn)
        started = time.perf_counter()
        removal = remove()
        ended = time.perf_counter()
        server_wal = _wal_mb(conn, since)
        end = max(ended, started + window)
        time.sleep(max(0.0, end - time.perf_counter()))
        workload.finish()
    latencies = workload.latencies(started, end)
    return Measured(
        removal,
        server_wal,
        percentile(latencies, 99) * 1000,
        max(latencies) * 1000,
        len(latencies) / (end - started),
    )


def _older_than(url: str, table: str, cutoff: datetime) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE created_at < %s").format(sql.Identifier(table)), (cutoff,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _vacuum(url: str) -> tuple[float, float, float]:
    """VACUUM of the flat table after the deletion: (seconds, WAL MB, size MB after)."""
    _checkpoint(url)
    with psycopg.connect(url, autocommit=True) as conn:
        since = _lsn(conn)
        started = time.perf_counter()
        conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(FLAT)))
        elapsed = time.perf_counter() - started
        return elapsed, _wal_mb(conn, since), size_mb(conn, FLAT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=10_000_000, help="messages in each table")
    parser.add_argument("--ops", type=int, default=10_000, help="inserts, and lookups, per hot-path measure")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the hot-path measures")
    parser.add_argument(
        "--window", type=float, default=20.0, help="the baseline's length, the shortest removal window (s)"
    )
    parser.add_argument("--database", default=BENCH_DATABASE, help="the benchmark's own database (dropped)")
    args = parser.parse_args()

    print(
        f"partitions benchmark: {args.rows} messages over 12 months and {PROJECTS} projects, in {FLAT}"
        f" and {BY_MONTH}; {args.ops} operations per hot-path measure, {args.rounds} rounds;"
        f" workload {WORKLOAD_RATE}/s, window {args.window:.0f} s",
        flush=True,
    )
    with bench_database(args.database) as url:
        h = history(args.rows, datetime.now(UTC))
        cutoff = h.oldest_month_end
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            build(conn, h)
            sizes = {table: size_mb(conn, table) for table in (FLAT, BY_MONTH)}
        oldest = _older_than(url, FLAT, cutoff)
        print(
            f"  built in {time.perf_counter() - started:.0f} s: {FLAT} {sizes[FLAT]:.0f} MB, {BY_MONTH}"
            f" {sizes[BY_MONTH]:.0f} MB (heap, TOAST, indexes); oldest month ({h.start:%Y-%m}) {oldest} rows",
            flush=True,
        )

        hot = hot_paths(url, h, args.ops, args.rounds)
        insert_ratio, lookup_ratio = print_hot_paths(url, h, hot)

        baseline = run_baseline(url, FLAT, args.window)
        _print_baseline(FLAT, baseline)
        delete = run_removal(url, FLAT, lambda: delete_month(url, cutoff), args.window)
        _print_removal("batched delete", FLAT, delete, baseline)
        vacuum_s, vacuum_wal, vacuumed_size = _vacuum(url)
        with psycopg.connect(url) as conn:
            deleted_size = size_mb(conn, FLAT)
        print(
            f"    size {sizes[FLAT]:.0f} MB before, {deleted_size:.0f} MB after the deletion;"
            f" VACUUM {vacuum_s:.1f} s, {vacuum_wal:.0f} MB of WAL, {vacuumed_size:.0f} MB after it",
            flush=True,
        )

        partitioned_baseline = run_baseline(url, BY_MONTH, args.window)
        _print_baseline(BY_MONTH, partitioned_baseline)
        drop = run_removal(url, BY_MONTH, lambda: drop_month(url, partition_name(h.start)), args.window)
        _print_removal("DETACH CONCURRENTLY + DROP", BY_MONTH, drop, partitioned_baseline)
        with psycopg.connect(url) as conn:
            dropped_size = size_mb(conn, BY_MONTH)
        print(f"    size {sizes[BY_MONTH]:.0f} MB before, {dropped_size:.0f} MB after", flush=True)
        left = {table: _older_than(url, table, cutoff) for table in (FLAT, BY_MONTH)}
    assert delete.removal.own_wal_mb is not None
    delete_wal = delete.removal.own_wal_mb
    if any(left.values()) or delete.removal.rows != oldest or drop.removal.rows != oldest:
        raise SystemExit(
            f"the oldest month ({oldest} rows) did not go whole: deleted {delete.removal.rows}, dropped"
            f" {drop.removal.rows}, left {left}"
        )
    print(
        f"partitions: rows={args.rows} delete_s={delete.removal.seconds:.1f}"
        f" drop_s={drop.removal.seconds:.2f} delete_wal_mb={delete_wal:.0f}"
        f" drop_wal_mb={drop.server_wal_mb:.1f}"
        f" delete_p99_ms={delete.p99_ms:.1f} drop_p99_ms={drop.p99_ms:.1f}"
        f" baseline_p99_ms={baseline.p99_ms:.1f} insert_ratio={insert_ratio:.2f}"
        f" lookup_ratio={lookup_ratio:.2f}"
    )


def _print_baseline(table: str, b: Baseline) -> None:
    print(
        f"  workload alone on {table}: p99 {b.p99_ms:.1f} ms, max {b.max_ms:.0f} ms, {b.ops_per_s:.0f} ops/s,"
        f" its WAL {b.wal_mb_per_s:.2f} MB/s",
        flush=True,
    )


def _print_removal(how: str, table: str, m: Measured, b: Baseline) -> None:
    own = "" if m.removal.own_wal_mb is None else f"its own WAL {m.removal.own_wal_mb:.1f} MB, "
    print(
        f"  {how} of the oldest month on {table}: {m.removal.rows} rows in {m.removal.seconds:.2f} s"
        f" ({m.removal.busy:.2f} s of it in statements), {own}{m.server_wal_mb:.1f} MB of WAL written by the"
        f" server meanwhile; workload p99"
        f" {m.p99_ms:.1f} ms ({m.p99_ms / b.p99_ms:.2f} of alone), max {m.max_ms:.0f} ms,"
        f" {m.ops_per_s:.0f} ops/s",
        flush=True,
    )


if __name__ == "__main__":
    main()
