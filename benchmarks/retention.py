"""`make bench-retention`: the release path's speed while the daily clean-up deletes finished enrollments.

1. Seeds N finished enrollments past retention (completed 100 days ago, each with its step run; one
   project, one sequence, a few contacts) in bulk SQL, in a database of its own, then VACUUM ANALYZE.
2. Baseline: R due enrollments in a second project, released by W worker processes (the release
   benchmark's worker) until none is left: steps/s.
3. The same again while ``run_retention`` runs in a process of its own: the deletion starts first, the
   release run right after it. The deletion's rows/s come from its own elapsed time. The release rate
   during the deletion counts the steps that ran while it lasted (each step run's ran_at), over the whole
   run when the deletion outlasts it, and is compared with the same seconds of the run alone.

The release projects are deleted after their run (the finished enrollments stay), and each run starts
after a CHECKPOINT (no flush of the seeding's writes under way), so both release runs start alike.
The last line is `retention: deleted_per_s=<n> release_ratio_during=<r>` (release steps/s during the
deletion over steps/s without it; the target is at least 0.8).
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from benchmarks.common import bench_database, start_all
from benchmarks.release import _worker as release_worker
from benchmarks.seed import seed_due_enrollments, seed_project
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.settings import DatabaseSettings
from libs.common.retention.cleanup import run_retention

BENCH_DATABASE = "followups_bench_retention"

#: Contacts the finished enrollments are spread over.
CONTACTS = 100
#: How long the deletion runs before the release workers start (seconds).
LEAD = 0.1
#: The shortest overlap of the deletion and a release run that is compared (seconds).
MIN_WINDOW = 1.0


def seed_finished(url: str, count: int) -> uuid.UUID:
    """``count`` enrollments completed about 100 days ago (past the default 90-day retention), each with
    one step run, in a project of their own; returns the project's id."""
    with psycopg.connect(url) as conn:
        project_id, sequence_id = seed_project(conn)
        params = {
            "project_id": project_id,
            "sequence_id": sequence_id,
            "contacts": CONTACTS,
            "count": count,
            "now": datetime.now(UTC),
        }
        conn.execute(
            """
            INSERT INTO contacts (project_id, phone, name)
            SELECT %(project_id)s, '+1' || lpad((3000000000 + g)::text, 10, '0'), 'Finished ' || g
            FROM generate_series(1, %(contacts)s) AS g
            """,
            params,
        )
        # finished_at 100 days ago, a millisecond apart in insertion order (as a day's completions are)
        conn.execute(
            """
            INSERT INTO followup_enrollments (project_id, sequence_id, version_id, contact_id, status,
                                              step_index, next_run_at, last_step_at, enrolled_at,
                                              finished_at, updated_at)
            SELECT %(project_id)s, s.id, s.current_version_id, c.id, 'completed', 1, f.at, f.at,
                   f.at - interval '1 day', f.at, f.at
            FROM generate_series(1, %(count)s) AS g
            CROSS JOIN LATERAL (
                SELECT %(now)s::timestamptz - interval '100 days' + g * interval '1 millisecond' AS at
            ) f
            JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS i FROM contacts
                  WHERE project_id = %(project_id)s) c ON c.i = g %% %(contacts)s
            CROSS JOIN followup_sequences s
            WHERE s.id = %(sequence_id)s
            ORDER BY g
            """,
            params,
        )
        conn.execute(
            """
            INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, message_id,
                                            due_at, ran_at)
            SELECT id, 0, project_id, 'queued', gen_random_uuid(), enrolled_at, finished_at
            FROM followup_enrollments WHERE project_id = %(project_id)s
            """,
            params,
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    return project_id


def _count(url: str, table: str, project_id: uuid.UUID) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table} WHERE project_id = %s", (project_id,)).fetchone()
    assert row is not None
    return int(row[0])


def _deleter(url: str, ready: Any, go: Any, results: Any) -> None:
    """``run_retention`` once, when told; puts (its result, elapsed s, wall-clock start, wall-clock end)."""
    # one connection holds the job's advisory lock, the other deletes the batches
    pool = create_pool(DatabaseSettings(url=url, pool_min_size=2, pool_max_size=2), name="bench-retention")
    ready.release()
    go.wait()
    wall_start = time.time()
    started = time.perf_counter()
    ok = run_retention(pool, SYSTEM_CLOCK.now)
    elapsed = time.perf_counter() - started
    results.put((ok, elapsed, wall_start, time.time()))
    pool.close()


def _result(results: Any, deleter: Any) -> tuple[bool | None, float, float, float]:
    """What the deletion process put, or an exit when it died without putting it."""
    while True:
        try:
            return results.get(timeout=1)  # type: ignore[no-any-return]
        except queue.Empty:
            if not deleter.is_alive():
                try:
                    return results.get(timeout=1)  # type: ignore[no-any-return]
                except queue.Empty:
                    raise SystemExit(f"the retention process died (exit code {deleter.exitcode})") from None


@dataclass
class Deletion:
    ok: bool | None
    #: Its own elapsed time (s).
    elapsed: float
    #: When it started and ended, in seconds from the release run's start.
    start: float
    end: float


@dataclass
class Run:
    steps_per_s: float
    #: The run's length (s).
    elapsed: float
    #: When each step ran, in seconds from the run's start.
    ran: list[float]
    deletion: Deletion | None

    def rate(self, start: float, end: float) -> float:
        """Steps/s of the steps that ran between ``start`` and ``end`` (seconds from the run's start)."""
        return sum(1 for at in self.ran if start <= at < end) / (end - start)


def run_release_beside(url: str, count: int, workers: int, *, delete: bool) -> Run:
    """Release ``count`` due enrollments (a fresh project) with ``workers`` processes, with the retention
    job started just before them when ``delete``. The project goes afterwards."""
    with psycopg.connect(url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(conn, project_id, sequence_id, count, due_at=datetime.now(UTC))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
        # no checkpoint left in progress by the seeding: each run starts with the data files flushed
        conn.execute("CHECKPOINT")
    context = multiprocessing.get_context("spawn")
    ready, go = context.Semaphore(0), context.Event()
    processes = [context.Process(target=release_worker, args=(url, ready, go)) for _ in range(workers)]
    start_all(processes, ready)
    deleter = None
    results = context.Queue()
    if delete:
        delete_go = context.Event()
        deleter = context.Process(target=_deleter, args=(url, ready, delete_go, results))
        deleter.start()
        ready.acquire()
        delete_go.set()
        time.sleep(LEAD)
    wall_start = time.time()
    started = time.perf_counter()
    go.set()
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    deletion = None
    if deleter is not None:
        ok, delete_elapsed, delete_start, delete_end = _result(results, deleter)
        deleter.join()
        deletion = Deletion(ok, delete_elapsed, delete_start - wall_start, delete_end - wall_start)
    with psycopg.connect(url) as conn:
        ran = [
            float(row[0])
            for row in conn.execute(
                "SELECT extract(epoch FROM ran_at) - %s FROM followup_step_runs WHERE project_id = %s",
                (wall_start, project_id),
            )
        ]
    assert len(ran) == count, f"released {len(ran)} of {count}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM projects WHERE id = %s", (project_id,))
        conn.execute("TRUNCATE outbox")
        conn.execute("VACUUM ANALYZE")
    return Run(count / elapsed, elapsed, sorted(ran), deletion)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "-n", "--finished", type=int, default=1_000_000, help="finished enrollments to delete"
    )
    parser.add_argument("--release", type=int, default=20_000, help="due enrollments per release run")
    parser.add_argument("-w", "--workers", type=int, default=2, help="release worker processes")
    args = parser.parse_args()

    print(
        f"retention benchmark: {args.finished} finished enrollments to delete, {args.release} due"
        f" enrollments per release run, {args.workers} worker processes"
    )
    with bench_database(BENCH_DATABASE) as url:
        started = time.perf_counter()
        finished_project = seed_finished(url, args.finished)
        seeded = _count(url, "followup_enrollments", finished_project)
        assert seeded == args.finished, f"seeded {seeded} of {args.finished}"
        print(
            f"  seeded {seeded} finished enrollments with their step runs"
            f" in {time.perf_counter() - started:.0f} s"
        )
        baseline = run_release_beside(url, args.release, args.workers, delete=False)
        print(f"  release path alone: {baseline.steps_per_s:.0f} steps/s over {baseline.elapsed:.1f} s")
        during = run_release_beside(url, args.release, args.workers, delete=True)
        deletion = during.deletion
        assert deletion is not None
        left = _count(url, "followup_enrollments", finished_project)
        left_runs = _count(url, "followup_step_runs", finished_project)
    if deletion.ok is not True or left or left_runs:
        raise SystemExit(
            f"retention did not finish: result {deletion.ok}, {left} enrollments, {left_runs} runs left"
        )
    deleted_per_s = seeded / deletion.elapsed
    print(
        f"  retention: {seeded} enrollments (and their step runs) deleted in {deletion.elapsed:.1f} s,"
        f" {deleted_per_s:.0f} enrollments/s"
    )
    print(
        f"  release path with the deletion started first: {during.steps_per_s:.0f} steps/s over the run"
        f" ({during.steps_per_s / baseline.steps_per_s:.2f} of alone)"
    )
    # the comparison covers the part of the run the deletion lasted (all of it when it outlasted the run),
    # against the same seconds of the run alone
    window = min(deletion.end, during.elapsed)
    if window < MIN_WINDOW:
        raise SystemExit(
            f"the deletion lasted only {window:.2f} s of the release run: too short to compare (raise -n)"
        )
    during_rate = during.rate(0.0, window)
    baseline_rate = baseline.rate(0.0, min(window, baseline.elapsed))
    ratio = during_rate / baseline_rate
    share = "the whole" if deletion.end >= during.elapsed else f"the first {window:.1f} s of the"
    print(
        f"  during the deletion ({share} release run): {during_rate:.0f} steps/s,"
        f" alone over the same seconds {baseline_rate:.0f} steps/s: ratio {ratio:.2f} (target >= 0.8)"
    )
    print(f"retention: deleted_per_s={deleted_per_s:.0f} release_ratio_during={ratio:.2f}")


if __name__ == "__main__":
    main()
