"""`make bench-release`: release throughput and lag, its pure-SQL ceiling, and the claim cost at scale.

1. Seeds N due enrollments (one message step each) in the configured PostgreSQL (DATABASE_URL, in a
   database of its own), runs W release worker processes until all are released, and prints steps/s and
   the p50/p99 release lag (queued time minus due time, as the lag histogram measures it).
2. The ceiling: pgbench runs the same release transaction's statements, generated from the release
   path's own named queries, as a script with W clients over a fresh seed of N enrollments; and the same
   statements through psycopg's cursors alone, a transaction in one pipeline, with W processes and no
   product code (:mod:`benchmarks.release_ceiling`): what the driver's cursors allow on this machine.
   Steps 1 and 2 run in turn, R rounds.
3. The claim cost: the median claim latency with 1,000,000 not-yet-due active enrollments in the table
   over the same with 10,000 (the partial claim index should keep it flat).

4. With the sending constraints configured but not binding (a send window open now, pacing 0, every cap
   high (per 24 h and per calendar day in the contact's zone), the spacing per contact kept (each
   contact's last message two days old), 20 connected numbers the contacts' conversations are spread
   over): steps/s again. Steps 1 and 4 run in turn, R rounds each (a slow spell of the machine falls on
   both alike); each prints the median of its runs, and the ratio is the median of the rounds' ratios.
   (Step 1 runs with the defaults, so it spaces messages per contact, 6 s, too: the product's default.)
5. Pacing on: the same 20 numbers with a pacing gap, over P enrollments; the ceiling is
   numbers x 1000 / send_delay_ms steps/s, and the ratio to it is printed.

6. A steady stream, not a backlog: steps falling due at S per second for T seconds (all enrolled
   beforehand, each due at its own time), released by W processes each running the release service's
   own polling loop (sleeping until the next due time, no RabbitMQ nudges): the p99 of the release lag.

7. Throughput against the backlog: steps/s draining 5,000 and then 100,000 enrollments due at once.

8. Fair across projects: one project with 100,000 steps due at once while 50 small projects each receive a
   steady trickle (steps falling due at ``--fair-rate`` per second across them for ``--fair-seconds``),
   released by W processes each running the release service's loop (turns across projects): the small
   projects' release lag p99, and the big project's drain rate over the same backlog drained alone (in the
   full run, step 7's figure).

Every seed of due enrollments comes with a message history (each contact wrote once and was answered, two
days before) and is analysed: the tables and their statistics are a running system's, not empty ones.

The last line is `release: steps_per_s=<n> ceiling_tps=<n> ratio=<r> driver_tps=<n> driver_ratio=<r>
lag_p99_ms=<n> worker_cpu_ms_per_step=<ms> backend_cpu_ms_per_step=<ms> claim_ratio_1m_10k=<r>
constrained_steps_per_s=<n> constrained_ratio=<r> paced_steps_per_s=<n> paced_ceiling=<n> paced_ratio=<r>
lag_p99_ms_steady=<n> steps_per_s_5k=<n> steps_per_s_100k=<n> backlog_ratio_100k_5k=<r>
small_project_lag_p99_ms=<n> big_project_steps_per_s=<n> fair_drain_ratio=<r>`.

Parts alone: ``--constrained-only`` (steps 1 and 4 in turn), ``--steady-only``, ``--backlog-only``,
``--fairness-only``, and ``--statements`` (the release transaction's statements through pgbench one at a
time with one client: each one's mean latency, as ``pgbench -r`` reports it).
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import multiprocessing
import os
import pstats
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from benchmarks.common import (
    CpuUsed,
    bench_database,
    cpu_ms_per,
    percentile,
    rss_mb,
    run_until_done,
    start_all,
)
from benchmarks.release_ceiling import run_ceiling, run_driver, statement_costs
from benchmarks.seed import NUMBERS, reset, seed_due, seed_due_enrollments, seed_history, seed_project
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.jobs import RoundRobin
from libs.common.core.loops import PollingLoop
from libs.common.core.settings import DatabaseSettings, FollowupSettings, WorkerSettings
from libs.common.followups import release_claim
from services.release import release

BENCH_DATABASE = "followups_bench"


def _worker(
    url: str, ready: Any, go: Any, profile: str | None = None, rss: Any = None, cpu: Any = None
) -> None:
    """A release worker draining every due enrollment (and waiting for the paced ones); with ``profile``,
    under cProfile (its stats written to ``profile`` + the process id); with ``rss`` (a shared double), it
    drains what is due now, then leaves its resident set size (MB) there; with ``cpu`` (two shared doubles),
    it leaves there the CPU seconds it used and its database backend used (-1: the backend is not on this
    machine) while draining."""
    pool = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=1))
    settings = FollowupSettings()
    turns = RoundRobin()
    profiler = cProfile.Profile() if profile is not None else None
    used = CpuUsed(pool)
    ready.release()
    go.wait()
    used.start()
    if profiler is not None:
        profiler.enable()
    while True:
        if release.release_batch(pool, SYSTEM_CLOCK, settings, limit=1000, turns=turns):
            continue
        if rss is not None:
            rss.value = rss_mb(os.getpid())
            break
        # nothing due now: done, unless paced follow-ups wait for their slots (poll like the loop does)
        with pool.connection() as conn:
            waiting = conn.execute("SELECT 1 FROM followup_enrollments WHERE status = 'active' LIMIT 1")
            if waiting.fetchone() is None:
                break
        time.sleep(0.005)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(f"{profile}.{os.getpid()}")
    if cpu is not None:
        cpu[0], cpu[1] = used.seconds()
    pool.close()


#: The CPU a release step cost, in ms: the workers' and their database backends' (the last run's).
LAST_CPU_MS_PER_STEP: list[tuple[float, float | None]] = []


def run_release(
    url: str, count: int, workers: int, settings: dict[str, Any] | None = None, *, profile: str | None = None
) -> tuple[float, float, float]:
    """Release ``count`` due enrollments with ``workers`` processes; (steps/s, p50 lag ms, p99 lag ms).
    With ``profile``, the workers run under cProfile (see :func:`_worker`). The CPU a step cost (the
    workers', their backends') is appended to :data:`LAST_CPU_MS_PER_STEP`."""
    reset(url)
    seed_due(url, count, settings)
    context = multiprocessing.get_context("spawn")
    ready, go = context.Semaphore(0), context.Event()
    cpus = [context.Array("d", 2) for _ in range(workers)]
    processes = [context.Process(target=_worker, args=(url, ready, go, profile, None, cpu)) for cpu in cpus]
    elapsed = run_until_done(processes, ready, go)
    with psycopg.connect(url) as conn:
        released = conn.execute("SELECT count(*) FROM followup_step_runs").fetchone()
        lags = [
            float(row[0])
            for row in conn.execute(
                "SELECT extract(epoch FROM ran_at - due_at) * 1000 FROM followup_step_runs ORDER BY 1"
            )
        ]
    assert released is not None and released[0] == count, f"released {released} of {count}"
    LAST_CPU_MS_PER_STEP.append(cpu_ms_per(cpus, count))
    return count / elapsed, percentile(lags, 50), percentile(lags, 99)


# --- a steady stream ----------------------------------------------------------------------------------


def _steady_worker(url: str, ready: Any, go: Any, stop: Any, next_due: bool) -> None:
    """The release service's loop, as `followups worker release` runs it (without a broker to nudge it)."""
    pool = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=1))
    settings = FollowupSettings()
    turns = RoundRobin()
    loop = PollingLoop(
        "release",
        lambda: release.release_batch(pool, SYSTEM_CLOCK, settings, turns=turns),
        poll_interval=WorkerSettings().poll_interval_seconds,
        idle_max_sleep=WorkerSettings().idle_max_sleep_seconds,
        next_due=(lambda: release.seconds_until_next_due(pool, SYSTEM_CLOCK)) if next_due else None,
    )
    ready.release()
    go.wait()
    loop.start()
    stop.wait()
    loop.stop()
    pool.close()


def _loops(url: str, workers: int, next_due: bool) -> tuple[list[Any], Any]:
    """``workers`` release loops (the service's own, a process each), started; and the event that stops
    them."""
    context = multiprocessing.get_context("spawn")
    ready, go, stop = context.Semaphore(0), context.Event(), context.Event()
    processes = [
        context.Process(target=_steady_worker, args=(url, ready, go, stop, next_due)) for _ in range(workers)
    ]
    start_all(processes, ready)
    go.set()
    return processes, stop


def _stream(url: str, rate: int, projects: list[Any] | None = None) -> None:
    """The enrollments (of ``projects``, else all) fall due in turn from a second on, one every 1/rate s,
    each at its own time (a stream, not a backlog)."""
    with psycopg.connect(url) as conn:
        conn.execute(
            """
            UPDATE followup_enrollments e
            SET next_run_at = now() + interval '1 second' + s.i * %(gap)s * interval '1 second',
                step_due_at = NULL
            FROM (SELECT project_id, id, row_number() OVER (ORDER BY id) - 1 AS i FROM followup_enrollments
                  WHERE %(projects)s::uuid[] IS NULL OR project_id = ANY(%(projects)s::uuid[])) s
            WHERE e.project_id = s.project_id AND e.id = s.id
            """,
            {"gap": 1 / rate, "projects": projects},
        )


def _await_runs(url: str, total: int, timeout: float) -> None:
    """Wait until ``total`` step runs are recorded, at most ``timeout`` seconds (the caller's count then
    says what was released)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            done = conn.execute("SELECT count(*) FROM followup_step_runs").fetchone()
            if done is not None and done[0] >= total:
                return
            time.sleep(0.5)


def run_steady(url: str, rate: int, seconds: int, workers: int, *, next_due: bool = True) -> float:
    """Steps falling due at ``rate``/s for ``seconds``, released by ``workers`` loops: the lag p99 (ms)."""
    reset(url)
    total = rate * seconds
    with psycopg.connect(url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(
            conn, project_id, sequence_id, total, due_at=datetime.now(UTC) + timedelta(days=1)
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE followup_enrollments")
    processes, stop = _loops(url, workers, next_due)
    _stream(url, rate)
    _await_runs(url, total, seconds + 60)
    with psycopg.connect(url, autocommit=True) as conn:
        lags = [
            float(row[0])
            for row in conn.execute(
                "SELECT extract(epoch FROM ran_at - due_at) * 1000 FROM followup_step_runs ORDER BY 1"
            )
        ]
    stop.set()
    for process in processes:
        process.join()
    assert len(lags) == total, f"released {len(lags)} of {total}"
    return percentile(lags, 99)


# --- fair across projects -------------------------------------------------------------------------------


def run_fairness(
    url: str, big: int, small_projects: int, rate: int, seconds: int, workers: int
) -> tuple[float, float]:
    """One project with ``big`` steps due at once and ``small_projects`` projects receiving ``rate`` steps a
    second between them for ``seconds``, released by ``workers`` loops: (the small projects' lag p99 in ms,
    the big project's steps/s)."""
    reset(url)
    trickle = rate * seconds
    with psycopg.connect(url) as conn:
        big_id, sequence_id = seed_project(conn)
        seed_due_enrollments(conn, big_id, sequence_id, big, due_at=datetime.now(UTC))
        seed_history(conn, big_id, before=datetime.now(UTC))
        small_ids = []
        for i in range(small_projects):
            project_id, sequence_id = seed_project(conn)
            count = trickle // small_projects + (1 if i < trickle % small_projects else 0)
            seed_due_enrollments(
                conn, project_id, sequence_id, count, due_at=datetime.now(UTC) + timedelta(days=1)
            )
            small_ids.append(project_id)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    processes, stop = _loops(url, workers, next_due=True)
    _stream(url, rate, small_ids)  # the trickle starts with the drain
    _await_runs(url, big + trickle, seconds + 3600)
    with psycopg.connect(url, autocommit=True) as conn:
        lags = [
            float(row[0])
            for row in conn.execute(
                "SELECT extract(epoch FROM ran_at - due_at) * 1000 FROM followup_step_runs"
                " WHERE project_id = ANY(%s) ORDER BY 1",
                (small_ids,),
            )
        ]
        row = conn.execute(
            "SELECT extract(epoch FROM max(ran_at) - min(ran_at)) FROM followup_step_runs"
            " WHERE project_id = %s",
            (big_id,),
        ).fetchone()
    stop.set()
    for process in processes:
        process.join()
    assert len(lags) == trickle, f"released {len(lags)} of {trickle}"
    drained_in = float(row[0]) if row and row[0] else float("nan")
    return percentile(lags, 99), big / drained_in


def _fairness_keys(small_lag_p99: float, big_rate: float, single_rate: float) -> str:
    return (
        f"small_project_lag_p99_ms={small_lag_p99:.0f} big_project_steps_per_s={big_rate:.0f} "
        f"fair_drain_ratio={big_rate / single_rate:.2f}"
    )


# --- the claim at scale ---------------------------------------------------------------------------------


def claim_latency(url: str, not_due: int, due: int, samples: int = 300) -> float:
    """Median claim latency (ms) with ``not_due`` active enrollments not yet due and ``due`` due ones."""
    reset(url)
    now = datetime.now(UTC)
    with psycopg.connect(url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(conn, project_id, sequence_id, due, due_at=now - timedelta(seconds=1))
        version = conn.execute(
            "SELECT current_version_id FROM followup_sequences WHERE id = %s", (sequence_id,)
        )
        version_id = version.fetchone()[0]  # type: ignore[index]
        contact_id = conn.execute("SELECT id FROM contacts LIMIT 1").fetchone()[0]  # type: ignore[index]
        # not-yet-due one-off enrollments (no sequence, so the one-live-per-contact index does not apply)
        conn.execute(
            """
            INSERT INTO followup_enrollments (project_id, version_id, contact_id, next_run_at, enrolled_at,
                                              updated_at)
            SELECT %(project_id)s, %(version_id)s, %(contact_id)s,
                   %(now)s + interval '1 hour' + g * interval '1 second', %(now)s, %(now)s
            FROM generate_series(1, %(count)s) AS g
            """,
            {
                "project_id": project_id,
                "version_id": version_id,
                "contact_id": contact_id,
                "now": now,
                "count": not_due,
            },
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE followup_enrollments")
    timings = []
    with psycopg.connect(url) as conn:
        for _ in range(samples):
            started = time.perf_counter()
            claim = release_claim.QUERIES["claim_due_enrollment"]
            conn.execute(claim, {"project_id": project_id, "now": now}).fetchone()
            timings.append((time.perf_counter() - started) * 1000)
            conn.rollback()
    return statistics.median(timings)


def drained_rss(url: str, due: int) -> float:
    """One release worker drains the ``due`` enrollments due now: its resident set size (MB) then."""
    context = multiprocessing.get_context("spawn")
    ready, go, rss = context.Semaphore(0), context.Event(), context.Value("d", 0.0)
    worker = context.Process(target=_worker, args=(url, ready, go, None, rss))
    start_all([worker], ready)
    go.set()
    worker.join()
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM followup_step_runs").fetchone()
    assert row is not None and row[0] == due, f"released {row} of {due}"
    return float(rss.value)


@dataclass
class Scale:
    """Per round, the figure with the small then the large table: claim medians (ms), worker RSS (MB)."""

    claims: list[tuple[float, float]] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)


def run_scale(url: str, args: argparse.Namespace) -> Scale:
    """The claim's latency, and a release worker's RSS once it drained ``args.scale_due`` due enrollments,
    with ``args.claim_small`` then ``args.claim_large`` not-yet-due ones in the table, in turn for
    ``args.rounds`` rounds."""
    scale = Scale()
    for _ in range(args.rounds):
        claims, sizes = [], []
        for not_due in (args.claim_small, args.claim_large):
            claims.append(claim_latency(url, not_due, args.scale_due))
            sizes.append(drained_rss(url, args.scale_due))
        scale.claims.append((claims[0], claims[1]))
        scale.rss.append((sizes[0], sizes[1]))
    small, large = (statistics.median(c[i] for c in scale.claims) for i in (0, 1))
    print(
        f"  claim median: {small:.3f} ms with {args.claim_small} not due, {large:.3f} ms with"
        f" {args.claim_large} (runs in turn: {' '.join(f'{s:.3f}/{b:.3f}' for s, b in scale.claims)})"
    )
    small, large = (statistics.median(r[i] for r in scale.rss) for i in (0, 1))
    print(
        f"  a release worker's RSS after draining {args.scale_due} due: {small:.1f} MB with"
        f" {args.claim_small} not due, {large:.1f} MB with {args.claim_large}"
        f" (runs in turn: {' '.join(f'{s:.1f}/{b:.1f}' for s, b in scale.rss)})"
    )
    return scale


def _scale_ratio(pairs: list[tuple[float, float]]) -> float:
    """The median of the rounds' large-over-small ratios."""
    return statistics.median(large / small for small, large in pairs)


def _table_size(count: int) -> str:
    return f"{count // 1_000_000}m" if count >= 1_000_000 and count % 1_000_000 == 0 else f"{count // 1000}k"


def _rss_keys(args: argparse.Namespace, scale: Scale) -> str:
    small, large = _table_size(args.claim_small), _table_size(args.claim_large)
    return (
        f"rss_mb_{small}={statistics.median(r[0] for r in scale.rss):.1f}"
        f" rss_mb_{large}={statistics.median(r[1] for r in scale.rss):.1f}"
        f" rss_ratio_{large}_{small}={_scale_ratio(scale.rss):.2f}"
    )


def _scale_keys(args: argparse.Namespace, scale: Scale) -> str:
    return f"claim_ratio_1m_10k={_scale_ratio(scale.claims):.2f} {_rss_keys(args, scale)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", "--enrollments", type=int, default=20_000)
    parser.add_argument("-w", "--workers", type=int, default=2)
    parser.add_argument("--claim-large", type=int, default=1_000_000)
    parser.add_argument("--claim-small", type=int, default=10_000)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the compared runs in turn (release/pgbench, 10k/1m, the backlogs)",
    )
    parser.add_argument(
        "--scale-due", type=int, default=2_000, help="due enrollments beside the not-due ones (claim, RSS)"
    )
    parser.add_argument(
        "--ratio-only", action="store_true", help="the release path and its pgbench ceiling in turn only"
    )
    parser.add_argument(
        "--scale-only",
        action="store_true",
        help="the claim latency and a worker's RSS with 10k and 1m not-due enrollments in turn only",
    )
    parser.add_argument(
        "--constrained-only",
        action="store_true",
        help="the unconstrained and the constrained runs in turn only (and their line's keys)",
    )
    parser.add_argument("--paced", type=int, default=2_000, help="enrollments of the paced run")
    parser.add_argument("--send-delay-ms", type=int, default=200, help="the paced run's pacing gap")
    parser.add_argument("--steady-rate", type=int, default=200, help="steps falling due per second")
    parser.add_argument("--steady-seconds", type=int, default=60, help="length of the steady stream")
    parser.add_argument(
        "--steady-only", action="store_true", help="run the steady stream only (and its line's key)"
    )
    parser.add_argument(
        "--no-next-due", action="store_true", help="the loops back off when idle (the design before)"
    )
    parser.add_argument("--backlog-small", type=int, default=5_000, help="the small backlog (due at once)")
    parser.add_argument("--backlog-large", type=int, default=100_000, help="the large backlog (due at once)")
    parser.add_argument(
        "--backlog-only", action="store_true", help="steps/s draining the small and the large backlog only"
    )
    parser.add_argument(
        "--fair-big", type=int, default=100_000, help="the big project's backlog (due at once)"
    )
    parser.add_argument("--fair-projects", type=int, default=50, help="small projects with a trickle")
    parser.add_argument(
        "--fair-rate", type=int, default=25, help="the small projects' steps falling due per second"
    )
    parser.add_argument("--fair-seconds", type=int, default=60, help="length of the small projects' trickle")
    parser.add_argument(
        "--fairness-only",
        action="store_true",
        help="the big backlog drained alone, then beside the small projects' trickle, only",
    )
    parser.add_argument(
        "--statements", action="store_true", help="the cost of each statement of the step (pgbench -r) only"
    )
    parser.add_argument(
        "--profile", action="store_true", help="one release run, its workers under cProfile: the heaviest"
    )
    parser.add_argument("--profile-top", type=int, default=15, help="functions the profile prints")
    parser.add_argument("--database", default=BENCH_DATABASE, help="the benchmark's own database (dropped)")
    args = parser.parse_args()

    if args.profile:
        with bench_database(args.database) as url, tempfile.TemporaryDirectory() as scratch:
            steps_per_s = run_release(url, args.enrollments, args.workers, profile=f"{scratch}/worker")[0]
            stats = pstats.Stats(*glob.glob(f"{scratch}/worker.*"))
        print(f"  the release workers under cProfile: {steps_per_s:.0f} steps/s; the heaviest, cumulative:")
        stats.sort_stats("cumulative").print_stats(args.profile_top)
        print(f"release: profiled_steps_per_s={steps_per_s:.0f}")
        return

    if args.statements:
        with bench_database(args.database) as url:
            costs = statement_costs(url, args.enrollments, 1)
        for latency, statement in costs:
            print(f"  {latency:8.3f} ms  {statement[:110]}")
        total = sum(latency for latency, _ in costs)
        print(f"release: statements={len(costs)} statement_ms_total={total:.3f}")
        return

    if args.backlog_only:
        with bench_database(args.database) as url:
            backlog = run_backlogs(url, args.backlog_small, args.backlog_large, args.workers, args.rounds)
        print(f"release: {_backlog_keys(args.backlog_small, args.backlog_large, *backlog)}")
        return

    if args.fairness_only:
        with bench_database(args.database) as url:
            single = run_release(url, args.fair_big, args.workers)[0]
            print(f"  backlog of {args.fair_big} alone: {single:.0f} steps/s")
            fair = _fairness(url, args)
        print(f"release: {_fairness_keys(*fair, single)}")
        return

    if args.steady_only:
        with bench_database(args.database) as url:
            steady = run_steady(
                url, args.steady_rate, args.steady_seconds, args.workers, next_due=not args.no_next_due
            )
        print(f"  steady {args.steady_rate}/s for {args.steady_seconds} s: lag p99 {steady:.0f} ms")
        print(f"release: lag_p99_ms_steady={steady:.0f}")
        return

    if args.ratio_only:
        with bench_database(args.database) as url:
            runs = run_in_turn(url, args, constrained=False)
        print(f"release: {_ratio_keys(runs)}")
        return

    if args.constrained_only:
        with bench_database(args.database) as url:
            runs = run_in_turn(url, args, constrained=True, ceiling=False)
        steps_per_s, _, lag_p99 = sorted(runs.plain)[len(runs.plain) // 2]
        print(f"release: steps_per_s={steps_per_s:.0f} lag_p99_ms={lag_p99:.0f} {_constrained_keys(runs)}")
        return

    if args.scale_only:
        with bench_database(args.database) as url:
            scale = run_scale(url, args)
        print(f"release: {_scale_keys(args, scale)}")
        return

    print(f"release benchmark: {args.enrollments} enrollments, {args.workers} worker processes")
    with bench_database(args.database) as url:
        runs = run_in_turn(url, args, constrained=True)
        scale = run_scale(url, args)
        paced, _, _ = run_release(url, args.paced, args.workers, {"send_delay_ms": args.send_delay_ms})
        paced_ceiling = NUMBERS * 1000 / args.send_delay_ms
        print(
            f"  pacing {args.send_delay_ms} ms over {NUMBERS} numbers:"
            f" {paced:.1f} steps/s of {paced_ceiling:.0f}"
        )
        steady = run_steady(url, args.steady_rate, args.steady_seconds, args.workers)
        print(f"  steady {args.steady_rate}/s for {args.steady_seconds} s: lag p99 {steady:.0f} ms")
        backlog = run_backlogs(url, args.backlog_small, args.backlog_large, args.workers, args.rounds)
        fair = _fairness(url, args)
        single = backlog[1]
        if args.fair_big != args.backlog_large:
            single = run_release(url, args.fair_big, args.workers)[0]
    print(
        f"release: {_ratio_keys(runs, lag=True)} claim_ratio_1m_10k={_scale_ratio(scale.claims):.2f} "
        f"{_constrained_keys(runs)} "
        f"paced_steps_per_s={paced:.1f} paced_ceiling={paced_ceiling:.0f} "
        f"paced_ratio={paced / paced_ceiling:.2f} lag_p99_ms_steady={steady:.0f} "
        f"{_backlog_keys(args.backlog_small, args.backlog_large, *backlog)} {_fairness_keys(*fair, single)} "
        f"{_rss_keys(args, scale)}"
    )


@dataclass
class InTurn:
    """The release runs, the constrained runs (when asked for) and the pgbench ceilings, one of each per
    round, in turn: a slow spell of the machine falls on all alike."""

    plain: list[tuple[float, float, float]] = field(default_factory=list)
    constrained: list[float] = field(default_factory=list)
    ceilings: list[float] = field(default_factory=list)
    #: psycopg alone over the same statements: (transactions/s, its clients' CPU ms a transaction, their
    #: backends').
    drivers: list[tuple[float, float, float | None]] = field(default_factory=list)
    #: The plain runs' CPU per step, in ms: the workers', their backends' (None: not on this machine).
    cpu: list[tuple[float, float | None]] = field(default_factory=list)


def run_in_turn(url: str, args: argparse.Namespace, *, constrained: bool, ceiling: bool = True) -> InTurn:
    """The release path, then (``constrained``) the same with every constraint configured, then
    (``ceiling``) its pgbench ceiling and the same statements through psycopg alone, in turn for
    ``args.rounds`` rounds."""
    runs = InTurn()
    for _ in range(args.rounds):
        runs.plain.append(run_release(url, args.enrollments, args.workers))
        runs.cpu.append(LAST_CPU_MS_PER_STEP[-1])
        if constrained:
            runs.constrained.append(run_release(url, args.enrollments, args.workers, _open_constraints())[0])
        if ceiling:
            runs.ceilings.append(run_ceiling(url, args.enrollments, args.workers))
            runs.drivers.append(run_driver(url, args.enrollments, args.workers))
    steps_per_s, lag_p50, lag_p99 = sorted(runs.plain)[len(runs.plain) // 2]
    print(f"  release path: {steps_per_s:.0f} steps/s, lag p50 {lag_p50:.0f} ms, p99 {lag_p99:.0f} ms")
    if constrained:
        in_turn = " ".join(f"{p[0]:.0f}/{c:.0f}" for p, c in zip(runs.plain, runs.constrained, strict=True))
        print(
            f"  constraints configured, none binding: {statistics.median(runs.constrained):.0f} steps/s"
            f" (runs in turn: {in_turn})"
        )
    if not ceiling:
        return runs
    in_turn = " ".join(
        f"{p[0]:.0f}/{d[0]:.0f}/{c:.0f}"
        for p, d, c in zip(runs.plain, runs.drivers, runs.ceilings, strict=True)
    )
    print(
        f"  pgbench ceiling (same statements, {args.workers} clients): {statistics.median(runs.ceilings):.0f}"
        f" tps (runs in turn, release/psycopg alone/pgbench: {in_turn})"
    )
    driver_tps, driver_ms, driver_backend_ms = sorted(runs.drivers)[len(runs.drivers) // 2]
    backend = f", its backends {driver_backend_ms:.3f} ms" if driver_backend_ms is not None else ""
    print(
        f"  psycopg alone (same statements, through cursors, no product code): {driver_tps:.0f} tps;"
        f" CPU a transaction: its clients {driver_ms:.3f} ms{backend}"
    )
    return runs


def _constrained_keys(runs: InTurn) -> str:
    """The constrained figure (the median) and the median of the rounds' ratios to the release path."""
    constrained = statistics.median(runs.constrained)
    ratio = statistics.median(c / p[0] for p, c in zip(runs.plain, runs.constrained, strict=True))
    return f"constrained_steps_per_s={constrained:.0f} constrained_ratio={ratio:.2f}"


def _ratio_keys(runs: InTurn, *, lag: bool = False) -> str:
    """The release figure, its ceiling, psycopg alone (medians) and the medians of the rounds' ratios (to
    pgbench)."""
    steps_per_s, _, lag_p99 = sorted(runs.plain)[len(runs.plain) // 2]
    ratio = statistics.median(p[0] / c for p, c in zip(runs.plain, runs.ceilings, strict=True))
    ceiling = statistics.median(runs.ceilings)
    keys = f"steps_per_s={steps_per_s:.0f} ceiling_tps={ceiling:.0f} ratio={ratio:.2f}"
    driver = statistics.median(d[0] for d in runs.drivers)
    driver_ratio = statistics.median(d[0] / c for d, c in zip(runs.drivers, runs.ceilings, strict=True))
    keys += f" driver_tps={driver:.0f} driver_ratio={driver_ratio:.2f}"
    return keys + (f" lag_p99_ms={lag_p99:.0f}" if lag else "") + _cpu_keys(runs)


def _cpu_keys(runs: InTurn) -> str:
    """The CPU one step cost, the medians of the plain runs: the release workers' and their database
    backends' (what the machine spends per step whatever else it is doing; the backends' is left out when
    the database is not on this machine)."""
    worker = statistics.median(w for w, _ in runs.cpu)
    keys = f" worker_cpu_ms_per_step={worker:.3f}"
    backends = [b for _, b in runs.cpu if b is not None]
    if len(backends) == len(runs.cpu):
        keys += f" backend_cpu_ms_per_step={statistics.median(backends):.3f}"
    return keys


def _fairness(url: str, args: argparse.Namespace) -> tuple[float, float]:
    small_lag_p99, big_rate = run_fairness(
        url, args.fair_big, args.fair_projects, args.fair_rate, args.fair_seconds, args.workers
    )
    print(
        f"  {args.fair_big} due in one project beside {args.fair_projects} projects trickling"
        f" {args.fair_rate}/s: small projects' lag p99 {small_lag_p99:.0f} ms,"
        f" the big one drained at {big_rate:.0f} steps/s"
    )
    return small_lag_p99, big_rate


def run_backlogs(url: str, small: int, large: int, workers: int, rounds: int) -> tuple[float, float, float]:
    """Steps/s draining ``small`` then ``large`` enrollments due at once, in turn for ``rounds`` rounds:
    (the medians of small and of large, the median of the rounds' large / small)."""
    pairs = [
        (run_release(url, small, workers)[0], run_release(url, large, workers)[0]) for _ in range(rounds)
    ]
    small_rate, large_rate = (statistics.median(pair[i] for pair in pairs) for i in (0, 1))
    print(
        f"  backlog of {small}: {small_rate:.0f} steps/s, of {large}: {large_rate:.0f} steps/s"
        f" (runs in turn: {' '.join(f'{s:.0f}/{b:.0f}' for s, b in pairs)})"
    )
    return small_rate, large_rate, _scale_ratio(pairs)


def _backlog_keys(small: int, large: int, small_rate: float, large_rate: float, ratio: float) -> str:
    names = f"{large // 1000}k_{small // 1000}k"
    return (
        f"steps_per_s_{small // 1000}k={small_rate:.0f} steps_per_s_{large // 1000}k={large_rate:.0f} "
        f"backlog_ratio_{names}={ratio:.2f}"
    )


def _open_constraints() -> dict[str, Any]:
    """Every constraint configured, none binding: a window open for the next hours, caps far away, the
    spacing per contact kept (each contact's last message is two days old), the frequency caps per 24 h
    and per day in the contact's zone both set (they read the contact's recent messages)."""
    now = datetime.now(UTC)
    return {
        "send_window": {"start": f"{(now.hour - 1) % 24:02d}:00", "end": f"{(now.hour + 3) % 24:02d}:00"},
        "consent_mode": "off",
        "max_per_contact_24h": 100,
        "max_per_contact_day": 100,
        "min_recipient_gap_seconds": 6,
        "send_delay_ms": 0,
        "max_in_flight_per_number": 1_000_000,
        "monthly_message_quota": 1_000_000_000,
        "max_send_lane_backlog": 10_000_000,
    }


if __name__ == "__main__":
    main()
