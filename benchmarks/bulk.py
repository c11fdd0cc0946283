"""`make bench-bulk`: how fast a bulk enrollment job enrolls, against enrolling the same contacts one by one;
and how fast a plan-limited project enrolls, against an unlimited one, at 100,000 live enrollments.

In a database of its own (``followups_bench_bulk`` on DATABASE_URL's server), seeds one project, N contacts
(100,000 by default, in one SQL statement) and, per round, published sequences of one message step (a day
after enrollment, so nothing falls due).

1. Bulk against one by one, in turn for R rounds (``--rounds``, 3; which goes first alternates, so that a
   slow spell of the shared machine does not fall on one side only), each round in sequences of its own:

   - Bulk: one job of the N contacts, created through ``bulk.create_job`` (a list of contact ids, copied
     in), then processed by one worker loop calling ``process_chunk(pool, SYSTEM_CLOCK)`` (the triggers
     service's ``bulk`` loop, ``bulk.CHUNK`` contacts a chunk, or ``--chunk``) until the job is completed.
     One process: a job is moved on by one worker at a time (its row is locked for each chunk), so more
     workers would not make one job faster. Its rate = N / the time from the first chunk to the job
     completed (creating the job is timed apart).
   - One by one: M contacts (5,000 by default: ``--one-by-one``; the first M of the same contacts) each
     enrolled through ``enroll()`` in a transaction of its own (what M API calls or rule actions would do,
     without HTTP). Its rate = M / time.

2. Plan limits: a second project with L live enrollments (100,000 by default: ``--live``, seeded in one
   statement, its live count then recounted as the retention job does) and K more contacts per round
   (``--limit-contacts``, 1,000), each enrolled through ``enroll()`` in a transaction of its own, for R
   rounds in turn: limited (``max_active_enrollments`` far above what is live: every enrollment locks the
   project and reads its live count) and unlimited (no limit), the same project and contacts, a sequence
   per round, after one untimed warm-up run of each (the first run of the pair otherwise paid for cold
   caches alone: 2.3 s where the others took 1.4 to 1.6).

Each figure is the median of its rounds; a ratio is the median of the rounds' ratios.

The process logs as a worker does (``LOG_LEVEL=INFO``, JSON: ``enroll()`` logs every enrollment), into
/dev/null; ``--no-logs`` leaves logging at WARNING to show what the log lines cost.

``--profile``: afterwards, a job of ``--profile-contacts`` (20,000) more contacts is run under cProfile,
with every statement timed on the client (round trip included, by the query's name in its .sql file) and
SAVEPOINT / RELEASE timed apart; both are printed.

The last line is `bulk: enrolled_per_s=<n> one_by_one_per_s=<n> ratio=<r> limited_per_s=<n>
unlimited_per_s=<n> limit_ratio=<r>`. Targets: 10,000 enrollments/s for the job; a limited project within
10 % of an unlimited one (limit_ratio at least 0.9).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool

from benchmarks.common import bench_database
from libs.common.core import outbox
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.logs import JsonFormatter
from libs.common.core.settings import DatabaseSettings
from libs.common.followups import enrollments, sequences, transitions
from libs.common.followups.definition import Definition, MessageStep
from libs.common.followups.enrollments import EnrollRequest, enroll
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.platform import projects
from libs.common.platform.projects import create_project
from libs.common.rules import bulk
from libs.common.rules.bulk import BulkCreate

BENCH_DATABASE = "followups_bench_bulk"
TARGET_PER_S = 10_000
#: Least limited_per_s / unlimited_per_s.
TARGET_LIMIT_RATIO = 0.9


def seed_contacts(
    conn: Connection[Any], project_id: uuid.UUID, count: int, *, first: int = 1
) -> list[uuid.UUID]:
    """``count`` contacts of the project (phones numbered from ``first``), in one statement: their ids."""
    now = datetime.now(UTC)
    return [
        row[0]
        for row in conn.execute(
            """
            INSERT INTO contacts (id, project_id, phone, name, created_at, updated_at)
            SELECT gen_random_uuid(), %(project_id)s, '+1' || lpad((5000000000 + g)::text, 10, '0'),
                   'Contact ' || g, %(now)s, %(now)s
            FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(count)s - 1) AS g
            ORDER BY g
            RETURNING id
            """,
            {"project_id": project_id, "count": count, "first": first, "now": now},
        )
    ]


def one_step_sequence(conn: Connection[Any], project_id: uuid.UUID, name: str) -> uuid.UUID:
    """A published sequence of one message a day after enrollment."""
    sequence = create_sequence(
        conn,
        project_id,
        SequenceCreate(
            name=name, definition=Definition(steps=[MessageStep(text="Hello", delay_seconds=86_400)])
        ),
    )
    publish_sequence(conn, project_id, sequence.id)
    return sequence.id


def _job_status(pool: ConnectionPool, job_id: uuid.UUID) -> tuple[str, int, int]:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT status, processed, enrolled FROM followup_bulk_jobs WHERE id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def run_job(
    pool: ConnectionPool,
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    contacts: list[uuid.UUID],
    chunk: int = bulk.CHUNK,
) -> float:
    """Create a job of ``contacts`` and process it to its end, as the bulk loop would: seconds taken to
    process it (creating it is timed and printed apart)."""
    started = time.perf_counter()
    with pool.connection() as conn:
        job, _ = bulk.create_job(
            conn,
            project_id,
            BulkCreate(sequence_id=sequence_id, contact_ids=contacts),
            now=SYSTEM_CLOCK.now(),
        )
    print(f"  job of {len(contacts)} contacts created in {time.perf_counter() - started:.2f} s")
    started = time.perf_counter()
    while True:
        if bulk.process_chunk(pool, SYSTEM_CLOCK, chunk=chunk):
            continue
        # 0: nothing to do, or the pass that completed the job handled no contact (a multiple of the chunk)
        if _job_status(pool, job.id)[0] not in ("queued", "running"):
            break
    elapsed = time.perf_counter() - started
    status, processed, enrolled = _job_status(pool, job.id)
    assert (status, processed, enrolled) == ("completed", len(contacts), len(contacts)), (
        status,
        processed,
        enrolled,
    )
    return elapsed


def run_one_by_one(
    pool: ConnectionPool, project_id: uuid.UUID, sequence_id: uuid.UUID, contacts: list[uuid.UUID]
) -> float:
    """Enroll each contact through ``enroll()`` in a transaction of its own: seconds taken."""
    started = time.perf_counter()
    for contact_id in contacts:
        with pool.connection() as conn:
            _, created = enroll(
                conn,
                project_id,
                EnrollRequest(contact_id=contact_id, sequence_id=sequence_id),
                now=SYSTEM_CLOCK.now(),
                source="api",
            )
        assert created
    return time.perf_counter() - started


# --- profile ------------------------------------------------------------------------------------------------


class _StatementTimer:
    """Client-side time of every statement (round trip included) by its query name, and of savepoints."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        for queries in (
            bulk.QUERIES,
            enrollments.QUERIES,
            sequences.QUERIES,
            outbox.QUERIES,
            projects.QUERIES,
        ):
            for name, text in queries.items():
                self.names[" ".join(str(text).split())[:80]] = name
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def name_of(self, query: Any) -> str:
        text = " ".join(str(query).split())[:80]
        return self.names.get(text, text[:60])

    def add(self, name: str, seconds: float) -> None:
        self.spent[name] += seconds
        self.calls[name] += 1

    @contextmanager
    def installed(self) -> Iterator[None]:
        cursor_execute = psycopg.Cursor.execute
        enter, exit_ = psycopg.Transaction.__enter__, psycopg.Transaction.__exit__
        timer = self

        def execute(cur: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return cursor_execute(cur, query, params, **kwargs)
            finally:
                timer.add(timer.name_of(query), time.perf_counter() - started)

        def tx_enter(tx: Any) -> Any:
            started = time.perf_counter()
            try:
                return enter(tx)
            finally:
                timer.add("SAVEPOINT / BEGIN", time.perf_counter() - started)

        def tx_exit(tx: Any, *args: Any) -> Any:
            started = time.perf_counter()
            try:
                return exit_(tx, *args)
            finally:
                timer.add("RELEASE / ROLLBACK TO", time.perf_counter() - started)

        psycopg.Cursor.execute = execute  # type: ignore[method-assign,assignment]
        psycopg.Transaction.__enter__ = tx_enter  # type: ignore[method-assign]
        psycopg.Transaction.__exit__ = tx_exit  # type: ignore[method-assign]
        try:
            yield
        finally:
            psycopg.Cursor.execute = cursor_execute  # type: ignore[method-assign]
            psycopg.Transaction.__enter__ = enter  # type: ignore[method-assign]
            psycopg.Transaction.__exit__ = exit_  # type: ignore[method-assign]

    def report(self, total_s: float, contacts: int) -> str:
        lines = [f"  statements, client-side (of {total_s:.2f} s for {contacts} contacts):"]
        for name, spent in sorted(self.spent.items(), key=lambda item: -item[1]):
            per = spent / self.calls[name] * 1e6
            share = 100 * spent / total_s
            lines.append(f"    {spent:7.2f} s {share:5.1f}%  {self.calls[name]:>7} x {per:6.0f} us  {name}")
        measured = sum(self.spent.values())
        outside = total_s - measured
        lines.append(f"    {outside:7.2f} s {100 * outside / total_s:5.1f}%  outside statements")
        return "\n".join(lines)


def profile(
    pool: ConnectionPool, project_id: uuid.UUID, sequence_id: uuid.UUID, contacts: list[uuid.UUID]
) -> None:
    timer = _StatementTimer()
    profiler = cProfile.Profile()
    with timer.installed():
        profiler.enable()
        elapsed = run_job(pool, project_id, sequence_id, contacts)
        profiler.disable()
    print(f"  profiled job: {len(contacts) / elapsed:.0f} enrolled/s (under the profiler)")
    print(timer.report(elapsed, len(contacts)))
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(35)
    print("  cProfile, by cumulative time:")
    print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip()))
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
    print("  cProfile, by own time:")
    print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip()))


def _logging(enabled: bool) -> None:
    """As a worker logs (INFO, JSON), into /dev/null; or WARNING only."""
    root = logging.getLogger()
    if enabled:
        handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 (for the process's life)
        handler.setFormatter(JsonFormatter())
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
    else:
        root.setLevel(logging.WARNING)


def seed_live(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID, count: int) -> None:
    """``count`` contacts of the project each with a live enrollment in the sequence (one statement), and
    the project's live count recounted (as the retention job does: the rows went in without it)."""
    conn.execute(
        """
        WITH contact AS (
            INSERT INTO contacts (id, project_id, phone, name, created_at, updated_at)
            SELECT gen_random_uuid(), %(project_id)s, '+2' || lpad(g::text, 10, '0'), 'Live ' || g,
                   now(), now()
            FROM generate_series(1, %(count)s) AS g
            RETURNING id
        )
        INSERT INTO followup_enrollments (project_id, sequence_id, version_id, contact_id, source,
                                          next_run_at, step_due_at, enrolled_at, updated_at)
        SELECT %(project_id)s, s.id, s.current_version_id, c.id, 'api', now() + interval '1 day',
               now() + interval '1 day', now(), now()
        FROM contact c, followup_sequences s
        WHERE s.project_id = %(project_id)s AND s.id = %(sequence_id)s
        """,
        {"project_id": project_id, "sequence_id": sequence_id, "count": count},
    )
    live, _ = transitions.recount_live(conn, project_id)
    assert live == count, (live, count)


def set_limit(pool: ConnectionPool, project_id: uuid.UUID, limit: int | None) -> None:
    with pool.connection() as conn:
        conn.execute("UPDATE projects SET max_active_enrollments = %s WHERE id = %s", (limit, project_id))


def in_turn(
    rounds: int, first: Callable[[int], float], second: Callable[[int], float], *, warm_up: bool = False
) -> list[tuple[float, float]]:
    """Each round's rates of ``first`` and ``second`` (given the round), run in turn, which goes first
    alternating. With ``warm_up``, each runs once first, untimed (given round -1): the first run of a
    short pair otherwise pays for cold caches alone, and drags its round's ratio down."""
    if warm_up:
        first(-1)
        second(-1)
    rates = []
    for round_ in range(rounds):
        if round_ % 2 == 0:
            a = first(round_)
            b = second(round_)
        else:
            b = second(round_)
            a = first(round_)
        rates.append((a, b))
    return rates


def _round(round_: int) -> str:
    """A round's name in the progress lines (round -1 is the warm-up)."""
    return "warm-up" if round_ < 0 else f"round {round_ + 1}"


def medians(rates: list[tuple[float, float]]) -> tuple[float, float, float]:
    """The median of each side's rates and of the rounds' ratios."""
    return (
        statistics.median(a for a, _ in rates),
        statistics.median(b for _, b in rates),
        statistics.median(a / b for a, b in rates),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", "--contacts", type=int, default=100_000, help="contacts of the bulk job")
    parser.add_argument("--one-by-one", type=int, default=5_000, help="contacts enrolled one by one a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each comparison")
    parser.add_argument("--chunk", type=int, default=bulk.CHUNK, help="contacts a bulk chunk enrolls")
    parser.add_argument("--live", type=int, default=100_000, help="live enrollments of the limited project")
    parser.add_argument("--limit-contacts", type=int, default=1_000, help="enrollments a round, limit or not")
    parser.add_argument("--no-logs", action="store_true", help="log at WARNING (a worker logs at INFO)")
    parser.add_argument("--profile", action="store_true", help="profile a further job (cProfile, statements)")
    parser.add_argument("--profile-contacts", type=int, default=20_000, help="contacts of the profiled job")
    args = parser.parse_args()
    one_by_one = min(args.one_by_one, args.contacts)
    _logging(not args.no_logs)

    print(
        f"bulk benchmark: a job of {args.contacts} contacts against {one_by_one} enrolled one by one, then"
        f" {args.limit_contacts} enrollments limited and not at {args.live} live, {args.rounds} rounds each"
        f" (logging: {'WARNING' if args.no_logs else 'INFO, JSON, to /dev/null'})"
    )
    with bench_database(BENCH_DATABASE) as url:
        started = time.perf_counter()
        with psycopg.connect(url) as conn:
            project_id = create_project(conn, "bench bulk").project_id
            contacts = seed_contacts(conn, project_id, args.contacts)
            extra = (
                seed_contacts(conn, project_id, args.profile_contacts, first=args.contacts + 1)
                if args.profile
                else []
            )
            limited_id = create_project(conn, "bench plan limit").project_id
            seed_live(conn, limited_id, one_step_sequence(conn, limited_id, "live"), args.live)
            to_limit = seed_contacts(conn, limited_id, args.limit_contacts)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        print(
            f"  seeded {args.contacts + len(extra) + args.limit_contacts + args.live} contacts,"
            f" {args.live} live enrollments, in {time.perf_counter() - started:.1f} s"
        )

        pool = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=2), name="bench-bulk")

        def sequence(project: uuid.UUID, name: str) -> uuid.UUID:
            with pool.connection() as conn:
                return one_step_sequence(conn, project, name)

        def job(round_: int) -> float:
            seconds = run_job(pool, project_id, sequence(project_id, f"bulk {round_}"), contacts, args.chunk)
            print(f"  round {round_ + 1}, bulk: {args.contacts} enrolled in {seconds:.1f} s")
            return float(args.contacts / seconds)

        def single(round_: int) -> float:
            seconds = run_one_by_one(
                pool, project_id, sequence(project_id, f"one {round_}"), contacts[:one_by_one]
            )
            print(f"  round {round_ + 1}, one by one: {one_by_one} enrolled in {seconds:.1f} s")
            return float(one_by_one / seconds)

        def limited(round_: int) -> float:
            set_limit(pool, limited_id, 1_000_000_000)
            seconds = run_one_by_one(pool, limited_id, sequence(limited_id, f"limited {round_}"), to_limit)
            print(f"  {_round(round_)}, limited: {args.limit_contacts} enrolled in {seconds:.1f} s")
            return float(args.limit_contacts / seconds)

        def unlimited(round_: int) -> float:
            set_limit(pool, limited_id, None)
            seconds = run_one_by_one(pool, limited_id, sequence(limited_id, f"unlimited {round_}"), to_limit)
            print(f"  {_round(round_)}, unlimited: {args.limit_contacts} enrolled in {seconds:.1f} s")
            return float(args.limit_contacts / seconds)

        try:
            bulk_per_s, single_per_s, ratio = medians(in_turn(args.rounds, job, single))
            print(
                f"  bulk: {bulk_per_s:.0f} enrollments/s (target: {TARGET_PER_S}/s), one by one:"
                f" {single_per_s:.0f}/s, medians of {args.rounds}"
            )
            limited_per_s, unlimited_per_s, limit_ratio = medians(
                in_turn(args.rounds, limited, unlimited, warm_up=True)
            )
            print(
                f"  at {args.live}+ live: limited {limited_per_s:.0f} enrollments/s, unlimited"
                f" {unlimited_per_s:.0f}/s (target ratio: {TARGET_LIMIT_RATIO}), medians of {args.rounds}"
            )
            if args.profile:
                profile(pool, project_id, sequence(project_id, "profiled"), extra)
        finally:
            pool.close()
    print(
        f"bulk: enrolled_per_s={bulk_per_s:.0f} one_by_one_per_s={single_per_s:.0f} ratio={ratio:.2f}"
        f" limited_per_s={limited_per_s:.0f} unlimited_per_s={unlimited_per_s:.0f}"
        f" limit_ratio={limit_ratio:.2f}"
    )


if __name__ == "__main__":
    main()
