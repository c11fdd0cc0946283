"""`make bench-sweep`: how fast the sweep of delayed rules drains a backlog, and its lag in a steady stream.

Seeds one project with one active delayed rule (``contact.updated``, conditions ``{"all": []}``, one cheap
action: a private note) and, in bulk SQL, N pending executions (100,000 by default) all due at once: each
with a contact of its own, an open conversation and a processed trigger row (the guard chain re-checks the
rule's conditions over the trigger's context).

1. Drain: W sweeper processes (2 by default) each call the triggers service's sweep
   (``sweep(pool, SYSTEM_CLOCK, stale_after=1 day, limit=100)``) in a loop until it claims nothing.
   drain_per_s = N / the time until both are done.
2. Steady stream: a producer inserts executions that fall due at R per second (500 by default) for S
   seconds (60 by default), in batches every 20 ms, each row with ``due_at`` its own intended due instant,
   inserted LEAD (2 s) before it; meanwhile the W sweepers run, each sweeping again at once after a sweep
   that claimed rows and polling every 10 ms (``--poll-ms``) when idle. The 10 ms poll stands for the
   triggers service's sweep loop (every ``RULES_SWEEP_INTERVAL_SECONDS``, 1 s by default, and at once on a
   nudge); with the 1 s default, add up to 1 s to the lags below (run with ``--poll-ms 1000`` to see it).
   The lag of an execution is the wall time its sweep returned (every row of the batch committed) minus
   its ``due_at``: an upper bound. ``executed_at`` is the ``now`` the sweep took just before running the
   row, so ``executed_at - due_at`` (what the lag histogram observes) is printed too, as the lower bound.

The last line is `sweep: drain_per_s=<n> lag_p99_ms_steady=<n>`. Targets: the drain of 100,000 in at most
60 s (drain_per_s >= 1667); steady lag p99 at most 2 s.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
from psycopg import Connection

from benchmarks.common import bench_database, percentile, start_all
from libs.common.core.db import create_pool
from libs.common.core.settings import DatabaseSettings
from libs.common.platform.projects import create_project
from libs.common.rules.executions import sweep
from libs.common.rules.rules import RuleCreate, create_rule

BENCH_DATABASE = "followups_bench_sweep"

#: What the triggers service passes (its default ``execution_stale_after_seconds``) and its batch size.
STALE_AFTER = timedelta(days=1)
LIMIT = 100
#: How long before its due time the producer inserts a row of the steady stream, and how often it inserts.
LEAD = timedelta(seconds=2)
BATCH_EVERY_S = 0.02
#: First phone number suffix of the steady stream's contacts (the backlog's come before).
STREAM_FIRST = 10_000_000


def seed_project_and_rule(
    conn: Connection[Any], *, now: datetime, actions: list[dict[str, Any]] | None = None
) -> tuple[uuid.UUID, uuid.UUID]:
    """A project and one active delayed rule on ``contact.updated`` whose conditions always hold, with
    ``actions`` (by default one private note); returns (project_id, rule_id)."""
    project_id = create_project(conn, "bench sweep").project_id
    rule = create_rule(
        conn,
        project_id,
        msgspec.convert(
            {
                "name": "delayed note",
                "event": "contact.updated",
                "conditions": {"all": []},
                "actions": actions or [{"type": "add_private_note", "text": "delayed rule ran"}],
                "execution_delay_minutes": 5,
            },
            RuleCreate,
        ),
        now=now,
    )
    return project_id, rule.id


def seed_executions(
    conn: Connection[Any],
    project_id: uuid.UUID,
    rule_id: uuid.UUID,
    count: int,
    *,
    first_due: datetime,
    step: timedelta = timedelta(0),
    first: int = 1,
    now: datetime,
) -> None:
    """``count`` pending executions of the rule (episode ``event:<trigger id>``), the i-th due at
    ``first_due + i * step``; each with a contact of its own (numbered from ``first``), the contact's open
    conversation and the trigger that opened the episode (already processed, so the triggers loop leaves
    it alone), in one statement."""
    conn.execute(
        """
        WITH s AS MATERIALIZED (
            SELECT g, gen_random_uuid() AS contact_id
            FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(count)s - 1) AS g
        ), c AS (
            INSERT INTO contacts (id, project_id, phone, name, created_at, updated_at)
            SELECT contact_id, %(project_id)s, '+1' || lpad((5000000000 + g)::text, 10, '0'), 'Contact ' || g,
                   %(now)s, %(now)s
            FROM s
        ), v AS (
            INSERT INTO conversations (project_id, contact_id, status_changed_at, created_at, updated_at)
            SELECT %(project_id)s, contact_id, %(now)s, %(now)s, %(now)s FROM s
        ), t AS (
            INSERT INTO followup_triggers (project_id, type, contact_id, payload, occurred_at,
                                           next_attempt_at, processed_at)
            SELECT %(project_id)s, 'contact.updated', contact_id, '{}', %(now)s, %(now)s, %(now)s FROM s
            RETURNING id, contact_id
        )
        INSERT INTO rule_pending_executions (project_id, rule_id, conversation_id, contact_id, trigger_id,
                                             episode_key, episode_kind, due_at, created_at, updated_at)
        SELECT %(project_id)s, %(rule_id)s, NULL, t.contact_id, t.id, 'event:' || t.id, 'event',
               %(first_due)s::timestamptz + (s.g - %(first)s) * %(step)s::interval, %(now)s, %(now)s
        FROM t JOIN s USING (contact_id)
        """,
        {
            "project_id": project_id,
            "rule_id": rule_id,
            "count": count,
            "first": first,
            "first_due": first_due,
            "step": step,
            "now": now,
        },
    )


class _RecordingClock:
    """The wall clock, remembering every ``now`` it gave since the last :meth:`taken`: the sweep writes the
    ``now`` it takes for each row as that row's ``executed_at``."""

    def __init__(self) -> None:
        self.given: list[datetime] = []

    def now(self) -> datetime:
        moment = datetime.now(UTC)
        self.given.append(moment)
        return moment

    def taken(self) -> list[datetime]:
        given, self.given = self.given, []
        return given


def _sweeper(url: str, ready: Any, go: Any, stop: Any, results: Any, idle_exit: bool, poll_s: float) -> None:
    pool = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=1))
    clock = _RecordingClock()
    ready.release()
    go.wait()
    # (the sweep's now, the wall time it returned) of each sweep that claimed rows
    batches: list[tuple[datetime, float]] = []
    while not stop.is_set():
        swept = sweep(pool, clock, stale_after=STALE_AFTER, limit=LIMIT)
        returned = time.time()
        given = clock.taken()
        if swept.claimed:
            batches += [(moment, returned) for moment in given]
            continue
        if idle_exit:
            break
        time.sleep(poll_s)
    results.put(batches)
    pool.close()


class _Sweepers:
    """W sweeper processes (spawned), started together."""

    def __init__(self, url: str, workers: int, *, idle_exit: bool, poll_s: float) -> None:
        context = multiprocessing.get_context("spawn")
        ready, self.go, self.stop, self.results = (
            context.Semaphore(0),
            context.Event(),
            context.Event(),
            context.Queue(),
        )
        self.processes = [
            context.Process(
                target=_sweeper, args=(url, ready, self.go, self.stop, self.results, idle_exit, poll_s)
            )
            for _ in range(workers)
        ]
        start_all(self.processes, ready)

    def start(self) -> float:
        self.go.set()
        return time.perf_counter()

    def join(self) -> dict[datetime, float]:
        """Wait for every sweeper (stopping them first unless they exit when idle): the wall time each
        batch's sweep returned, by the batch's ``now``."""
        batches = [item for _ in self.processes for item in self.results.get()]
        for process in self.processes:
            process.join()
            assert process.exitcode == 0, f"a sweeper failed (exit code {process.exitcode})"
        return dict(batches)


def _count(url: str, query: str, *params: Any) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def _check_exactly_once(url: str, expected: int) -> None:
    """Every execution executed, and each wrote exactly one note (one contact per execution)."""
    with psycopg.connect(url) as conn:
        query = "SELECT status, count(*) FROM rule_pending_executions GROUP BY 1"
        statuses = {status: count for status, count in conn.execute(query).fetchall()}
        notes = conn.execute(
            "SELECT count(*), count(DISTINCT contact_id) FROM activities WHERE kind = 'private_note'"
        ).fetchone()
    assert statuses == {"executed": expected}, statuses
    assert notes == (expected, expected), notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", "--executions", type=int, default=100_000, help="the backlog to drain")
    parser.add_argument("-w", "--workers", type=int, default=2, help="sweeper processes")
    parser.add_argument("--rate", type=int, default=500, help="executions falling due per second (steady)")
    parser.add_argument("--seconds", type=int, default=60, help="length of the steady stream")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="an idle sweeper's poll interval")
    args = parser.parse_args()
    poll_s = args.poll_ms / 1000

    print(f"sweep benchmark: {args.executions} due executions, {args.workers} sweeper processes")
    with bench_database(BENCH_DATABASE) as url:
        now = datetime.now(UTC)
        started = time.perf_counter()
        with psycopg.connect(url) as conn:
            project_id, rule_id = seed_project_and_rule(conn, now=now)
            seed_executions(
                conn, project_id, rule_id, args.executions, first_due=now - timedelta(seconds=1), now=now
            )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        print(f"  seeded in {time.perf_counter() - started:.1f} s")

        # 1. drain the backlog
        sweepers = _Sweepers(url, args.workers, idle_exit=True, poll_s=poll_s)
        started = sweepers.start()
        sweepers.join()
        drain_s = time.perf_counter() - started
        _check_exactly_once(url, args.executions)
        drain_per_s = args.executions / drain_s
        print(
            f"  drained {args.executions} in {drain_s:.1f} s: {drain_per_s:.0f} executions/s"
            " (target: 100,000 in at most 60 s)"
        )

        # 2. a steady stream falling due at --rate per second
        total = args.rate * args.seconds
        per_batch = max(1, round(args.rate * BATCH_EVERY_S))
        leads: list[float] = []

        def produce() -> None:
            step = timedelta(seconds=1 / args.rate)
            with psycopg.connect(url) as conn:
                begin = time.time()
                first_due = datetime.fromtimestamp(begin, UTC) + LEAD
                made = 0
                while made < total:
                    count = min(per_batch, total - made)
                    time.sleep(max(0.0, begin + made / args.rate - time.time()))
                    due = first_due + made * step
                    seed_executions(
                        conn,
                        project_id,
                        rule_id,
                        count,
                        first_due=due,
                        step=step,
                        first=STREAM_FIRST + made,
                        now=datetime.now(UTC),
                    )
                    conn.commit()
                    leads.append((due - datetime.now(UTC)).total_seconds())
                    made += count

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        stream_from = datetime.now(UTC)
        sweepers = _Sweepers(url, args.workers, idle_exit=False, poll_s=poll_s)
        sweepers.start()
        producer = threading.Thread(target=produce)
        producer.start()
        producer.join()
        deadline = time.monotonic() + 60
        query = "SELECT count(*) FROM rule_pending_executions WHERE status = 'pending'"
        while _count(url, query) and time.monotonic() < deadline:
            time.sleep(0.1)
        sweepers.stop.set()
        committed = sweepers.join()
        _check_exactly_once(url, args.executions + total)
        with psycopg.connect(url) as conn:
            executed = conn.execute(
                "SELECT due_at, executed_at FROM rule_pending_executions WHERE due_at >= %s",
                (stream_from,),
            ).fetchall()
        assert len(executed) == total, f"{len(executed)} stream rows, {total} expected"
        unmatched = sum(1 for _, at in executed if at not in committed)
        assert unmatched == 0, f"{unmatched} rows executed by no recorded sweep"
        lags = [(committed[at] - due.timestamp()) * 1000 for due, at in executed]
        claim_lags = [(at - due).total_seconds() * 1000 for due, at in executed]
        p50, p99, worst = statistics.median(lags), percentile(lags, 99), max(lags)
        print(
            f"  steady {args.rate}/s for {args.seconds} s ({total} executions, inserted"
            f" {min(leads):.2f} s or more before due; idle poll {args.poll_ms:g} ms):"
            f" lag due to committed p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {worst:.0f} ms;"
            f" due to claimed (executed_at) p99 {percentile(claim_lags, 99):.0f} ms (target: p99 at most 2 s)"
        )
    print(f"sweep: drain_per_s={drain_per_s:.0f} lag_p99_ms_steady={p99:.0f}")


if __name__ == "__main__":
    main()
