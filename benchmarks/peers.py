"""`make bench-peers`: our release and stop paths against two peers, on the same PostgreSQL and machine.

1. Throughput. N due enrollments released by W worker processes, a full follow-up step per transaction
   (:func:`benchmarks.release.run_release`: claim, render, queue the message, record the step run, finish
   the enrollment, write the outbox events) -> steps/s, from the start signal until every worker exited.
   Against PgQueuer (psycopg driver): N jobs enqueued up front, W consumer PROCESSES, each one
   QueueManager with batch size 1 and its default concurrency (unlimited tasks per process), run under
   uvloop like `pgq run` does. That is its normal deployment: `pgq run module:factory` runs one
   QueueManager per process and one scales out with processes. Each job inserts one row (autocommit, on
   the process's own job connection) into a table of ours -> jobs/s from the first to the last row's
   ``clock_timestamp()`` (the wall time from the start signal is printed too). Both run in turn, R
   rounds (a slow spell of the machine falls on both alike): the medians, and the median of the rounds'
   ratios.
2. 100,000 pending follow-ups in Dramatiq's own delayed messages: ``send_with_options(delay=<hours>)``
   to a queue of our own on RabbitMQ (AMQP_URL), then one Dramatiq worker process (its defaults: 8
   threads) started on it. Dramatiq keeps delayed messages in the queue's ``.DQ`` and the worker
   prefetches up to ``delay_queue_prefetch`` (default 1,000 per thread) of them into memory until their
   eta: the worker's RSS before and after it fetched them, how many it holds, and RabbitMQ's memory for
   the queues (``rabbitmqctl list_queues``, as root on the broker's machine; "n/a" otherwise).
   Cancelling one (a contact replied): Dramatiq has no cancel. Either a marker the actor checks at
   delivery (timed: one INSERT and COMMIT in PostgreSQL; the message stays in RabbitMQ and in a worker's
   memory until its eta), or removing it from the broker: stop the workers (a worker's prefetched
   messages cannot be reached), consume the whole ``.DQ`` and re-publish every message but the cancelled
   one, in AMQP transactions of 1,000 (timed once: it is O(pending) per cancel).
3. Ours with the same 100,000 follow-ups pending (enrollments due in the same hours): one release worker
   process running the release service's loop; its RSS before and after (the claim reads one row at a
   time, so it should not grow), and our stop path cancelling one contact's follow-up
   (:func:`libs.common.followups.stops.stop_followups_for_contact` after locking the contact, with its
   COMMIT), the median of C samples, while the worker runs.

The queues are uniquely named and deleted afterwards (also on failure); the database is the benchmark's
own (dropped afterwards). The last line is `peers: ours_steps_per_s=<n> pgqueuer_jobs_per_s=<n>
ratio=<ours/pgqueuer> dramatiq_rss_mb_100k=<n> ours_rss_mb_100k=<n> dramatiq_held=<n>
dramatiq_mark_cancel_ms=<n> dramatiq_cancel_ms=<n> ours_cancel_ms=<n>`.

Needs the optional extra: `pip install -e '.[peers]'` (PgQueuer); `make bench-peers` installs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import secrets
import shutil
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import dramatiq
import pika
import psycopg
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import dq_name, xq_name
from dramatiq.worker import DELAY_QUEUE_PREFETCH

from benchmarks import release as release_bench
from benchmarks.common import bench_database, rss_mb, start_all
from benchmarks.seed import reset, seed_due_enrollments, seed_project
from libs.common.followups.stops import stop_followups_for_contact
from libs.common.platform.contacts import lock_contact

BENCH_DATABASE = "followups_bench_peers"

#: PgQueuer's entrypoint for the one-insert job.
PGQ_ENTRYPOINT = "peers_insert_one"

#: The table each PgQueuer job inserts its row into (ours, not PgQueuer's).
JOB_ROWS_DDL = """
CREATE TABLE IF NOT EXISTS peers_job_rows (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    done_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

#: The cancel markers a Dramatiq actor would check at delivery.
MARKERS_DDL = """
CREATE TABLE IF NOT EXISTS peers_cancelled (
    message_id text PRIMARY KEY,
    cancelled_at timestamptz NOT NULL DEFAULT now()
)
"""

#: The Dramatiq actor's name (its queue is unique per run).
DRAMATIQ_ACTOR = "peers_followup_due"


def amqp_url() -> str:
    return os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def _run_async(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` under uvloop when installed (as `pgq run` does), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


# --- 1. throughput: PgQueuer --------------------------------------------------------------------------


async def _pgq_install(url: str, count: int) -> None:
    """PgQueuer's own schema (its Queries API, as `pgq install` runs it) once, then ``count`` jobs."""
    from pgqueuer import Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries.from_psycopg_connection(conn)
        if not await queries.schema_is_installed():
            await queries.install()
        await conn.execute(JOB_ROWS_DDL)
        await conn.execute("TRUNCATE peers_job_rows")
        await queries.clear_queue()
        for start in range(0, count, 5000):
            size = min(5000, count - start)
            await queries.enqueue(
                [PGQ_ENTRYPOINT] * size, [str(start + i).encode() for i in range(size)], [0] * size
            )


async def _pgq_consume(url: str, batch_size: int, max_concurrent: int | None, go: Any) -> None:
    from pgqueuer import Job, PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as job_conn,
    ):
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        async def insert_one(job: Job) -> None:
            await job_conn.execute("INSERT INTO peers_job_rows (job_id) VALUES (%s)", (job.id,))

        qm.entrypoint(PGQ_ENTRYPOINT)(insert_one)  # not as a decorator: untyped without the extra
        await asyncio.to_thread(go.wait)
        await qm.run(
            batch_size=batch_size, mode=QueueExecutionMode.drain, max_concurrent_tasks=max_concurrent
        )


def _pgq_consumer(url: str, batch_size: int, max_concurrent: int | None, ready: Any, go: Any) -> None:
    ready.release()
    _run_async(_pgq_consume(url, batch_size, max_concurrent, go))


def run_pgqueuer(
    url: str, count: int, consumers: int, batch_size: int = 1, max_concurrent: int | None = None
) -> tuple[float, float]:
    """``count`` one-insert jobs drained by ``consumers`` processes: (jobs/s first to last completion,
    jobs/s from the start signal until every consumer exited)."""
    _run_async(_pgq_install(url, count))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    context = multiprocessing.get_context("spawn")
    ready, go = context.Semaphore(0), context.Event()
    processes = [
        context.Process(target=_pgq_consumer, args=(url, batch_size, max_concurrent, ready, go))
        for _ in range(consumers)
    ]
    start_all(processes, ready)
    time.sleep(1.0)  # each has connected and is waiting on the signal
    started = time.perf_counter()
    go.set()
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT job_id), extract(epoch FROM max(done_at) - min(done_at))"
            " FROM peers_job_rows"
        ).fetchone()
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
    assert row is not None and left is not None
    done, distinct, span = int(row[0]), int(row[1]), float(row[2] or 0)
    assert done == distinct == count and left[0] == 0, f"pgqueuer did {done} ({distinct}) of {count}"
    return (count - 1) / span if span else 0.0, count / elapsed


# --- 2. Dramatiq's delayed messages ---------------------------------------------------------------------


def _followup_due(contact_id: str, step: int) -> None:
    """The Dramatiq actor of a delayed follow-up. A real one would first look up a cancel marker (the
    check-at-delivery cancel); none is delivered here: they are due hours from now."""


def _declare(queue: str) -> tuple[RabbitmqBroker, dramatiq.Actor[Any, Any]]:
    broker = RabbitmqBroker(url=amqp_url())
    actor = dramatiq.actor(actor_name=DRAMATIQ_ACTOR, queue_name=queue, broker=broker)(_followup_due)
    return broker, actor


def _dramatiq_worker(queue: str, threads: int, ready: Any, go: Any, stop: Any) -> None:
    """A Dramatiq worker process on ``queue`` (as `dramatiq` runs one: a Worker of ``threads`` threads)."""
    broker, _ = _declare(queue)
    ready.release()
    go.wait()
    worker = dramatiq.Worker(broker, worker_threads=threads)
    worker.start()
    stop.wait()
    worker.stop()
    broker.close()


def _queue_counts(channel: Any, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of ``queue``."""
    declared = channel.queue_declare(queue=queue, passive=True)
    return int(declared.method.message_count), int(declared.method.consumer_count)


def rabbitmq_queue_memory(queues: list[str]) -> dict[str, tuple[int, int, int]] | None:
    """{queue: (messages, unacknowledged, memory bytes)} from `rabbitmqctl`, or None when it cannot tell
    (not installed, not root, or the broker is on another machine)."""
    host = urlsplit(amqp_url()).hostname or "127.0.0.1"
    rabbitmqctl = shutil.which("rabbitmqctl")
    if rabbitmqctl is None or host not in ("127.0.0.1", "localhost", "::1"):
        return None
    result = subprocess.run(
        [rabbitmqctl, "-q", "list_queues", "name", "messages", "messages_unacknowledged", "memory"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        return None
    found = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] in queues:
            found[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    return found


def _print_rabbitmq(label: str, queues: list[str]) -> float | None:
    memory = rabbitmq_queue_memory(queues)
    if memory is None:
        print(f"  RabbitMQ {label}: n/a (rabbitmqctl needs root on the broker's machine)")
        return None
    total = sum(m for _, _, m in memory.values()) / 2**20
    detail = ", ".join(
        f"{name[-3:] if name.endswith(('.DQ', '.XQ')) else 'queue'}: {n:,} msgs ({u:,} unacked)"
        f" {m / 2**20:.1f} MB"
        for name, (n, u, m) in memory.items()
    )
    print(f"  RabbitMQ {label}: {total:.1f} MB over the queues ({detail})")
    return total


def _settle(sample: Callable[[], tuple[float, int]], seconds: float, timeout: float) -> tuple[float, int]:
    """Sample until the values have not changed for ``seconds`` (or ``timeout``): the last sample."""
    deadline = time.monotonic() + timeout
    last = sample()
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        current = sample()
        if current[1] != last[1] or abs(current[0] - last[0]) > 0.5:
            since = time.monotonic()
        last = current
        if time.monotonic() - since >= seconds:
            break
    return last


def mark_cancel_latency(url: str, message_ids: list[str]) -> float:
    """Median ms of writing a cancel marker the actor would check at delivery (INSERT and COMMIT)."""
    timings = []
    with psycopg.connect(url) as conn:
        conn.execute(MARKERS_DDL)
        conn.commit()
        for message_id in message_ids:
            started = time.perf_counter()
            conn.execute("INSERT INTO peers_cancelled (message_id) VALUES (%s)", (message_id,))
            conn.commit()
            timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def remove_from_broker(channel: Any, queue: str, message_id: str, batch: int = 1000) -> float:
    """Remove one delayed message from ``queue`` (no consumer on it): consume every message once and
    re-publish all but ``message_id``, acknowledging in AMQP transactions of ``batch``. Returns ms."""
    started = time.perf_counter()
    total, _ = _queue_counts(channel, queue)
    channel.basic_qos(prefetch_count=batch)
    channel.tx_select()
    removed = 0
    for seen, (method, properties, body) in enumerate(channel.consume(queue, inactivity_timeout=30), 1):
        if method is None:
            raise RuntimeError(f"{queue}: no message for 30 s after {seen - 1} of {total}")
        if json.loads(body)["message_id"] == message_id:
            removed += 1
        else:
            channel.basic_publish(exchange="", routing_key=queue, body=body, properties=properties)
        if seen % batch == 0 or seen == total:
            channel.basic_ack(delivery_tag=method.delivery_tag, multiple=True)
            channel.tx_commit()
        if seen == total:
            break
    channel.cancel()  # the re-published copies it prefetched go back to the queue
    channel.tx_commit()
    elapsed = (time.perf_counter() - started) * 1000
    left, _ = _queue_counts(channel, queue)
    assert removed == 1 and left == total - 1, f"removed {removed}, {left} left of {total}"
    return elapsed


def _channel() -> tuple[pika.BlockingConnection, Any]:
    """A fresh AMQP connection and channel (a BlockingConnection left idle misses its heartbeats)."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url()))
    return connection, connection.channel()


def run_dramatiq(url: str, pending: int, delay_hours: float, threads: int, samples: int) -> dict[str, Any]:
    """Dramatiq with ``pending`` delayed follow-ups: the worker's RSS, RabbitMQ's memory, a cancel."""
    queue = f"followups_peers_{secrets.token_hex(4)}"
    delayed = dq_name(queue)
    queues = [queue, delayed, xq_name(queue)]
    context = multiprocessing.get_context("spawn")
    ready, go, stop = context.Semaphore(0), context.Event(), context.Event()
    worker = context.Process(target=_dramatiq_worker, args=(queue, threads, ready, go, stop))
    result: dict[str, Any] = {}
    try:
        broker, actor = _declare(queue)
        delay_ms = int(delay_hours * 3_600_000)
        started = time.perf_counter()
        message_ids = [
            actor.send_with_options(args=(str(uuid.uuid4()), 0), delay=delay_ms).message_id
            for _ in range(pending)
        ]
        sent_in = time.perf_counter() - started
        broker.close()
        print(
            f"  sent {pending:,} delayed messages (delay {delay_hours:g} h) in {sent_in:.1f} s"
            f" ({pending / sent_in:,.0f}/s)"
        )
        connection, channel = _channel()
        waiting, _ = _queue_counts(channel, delayed)
        assert waiting == pending, f"{waiting} of {pending} in {delayed}"
        result["broker_mb_idle"] = _print_rabbitmq("with no worker", queues)

        worker.start()
        ready.acquire()
        time.sleep(0.5)
        assert worker.pid is not None
        baseline = rss_mb(worker.pid)
        go.set()

        def sample() -> tuple[float, int]:
            return rss_mb(worker.pid or 0), _queue_counts(channel, delayed)[0]

        rss, ready_left = _settle(sample, seconds=3.0, timeout=120.0)
        held = pending - ready_left
        result |= {"rss_before": baseline, "rss": rss, "held": held}
        per_kb = (rss - baseline) * 1024 / held if held else 0.0
        prefetch = DELAY_QUEUE_PREFETCH or min(threads * 1000, 65535)
        print(
            f"  Dramatiq worker ({threads} threads, delay-queue prefetch {prefetch:,}):"
            f" RSS {baseline:.1f} MB before, {rss:.1f} MB holding {held:,} of {pending:,} delayed"
            f" messages ({per_kb:.2f} KB each; all {pending:,} would be"
            f" {baseline + per_kb * pending / 1024:.0f} MB)"
        )
        result["broker_mb"] = _print_rabbitmq("with the worker", queues)
        connection.close()

        result["mark_cancel_ms"] = mark_cancel_latency(url, random.sample(message_ids, samples))
        print(
            f"  cancel by a marker checked at delivery: {result['mark_cancel_ms']:.2f} ms median"
            " (INSERT and COMMIT); the message stays in RabbitMQ and in a worker until its eta"
        )
        stop.set()
        worker.join(timeout=60)
        connection, channel = _channel()
        deadline = time.monotonic() + 60
        while _queue_counts(channel, delayed) != (pending, 0) and time.monotonic() < deadline:
            time.sleep(0.2)  # the stopped worker's prefetched messages come back to the queue
        result["cancel_ms"] = remove_from_broker(channel, delayed, random.choice(message_ids))
        connection.close()
        print(
            f"  cancel by removing it from RabbitMQ (workers stopped, {pending:,} consumed and re-published"
            f" in transactions of 1,000): {result['cancel_ms']:.0f} ms"
        )
    finally:
        if worker.is_alive():
            stop.set()
            go.set()
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
        connection, channel = _channel()
        for name in queues:
            channel.queue_delete(queue=name)
        connection.close()
    return result


# --- 3. ours with the same follow-ups pending -----------------------------------------------------------


def stop_latency(url: str, project_id: uuid.UUID, contacts: list[uuid.UUID]) -> float:
    """Median ms of a reply's stop path for one contact with a pending follow-up, with its COMMIT."""
    timings = []
    with psycopg.connect(url) as conn:
        for contact_id in contacts:
            started = time.perf_counter()
            lock_contact(conn, project_id, contact_id)  # as a reply locks it: by its project's key
            stopped = stop_followups_for_contact(conn, project_id, contact_id, "reply", now=datetime.now(UTC))
            conn.commit()
            timings.append((time.perf_counter() - started) * 1000)
            assert len(stopped.enrollment_ids) == 1, stopped
    return statistics.median(timings)


def run_ours_pending(url: str, pending: int, delay_hours: float, samples: int) -> dict[str, Any]:
    """``pending`` enrollments due in ``delay_hours``; one release worker running its loop: its RSS and the
    stop path's latency."""
    reset(url)
    due_at = datetime.now(UTC) + timedelta(hours=delay_hours)
    with psycopg.connect(url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(conn, project_id, sequence_id, pending, due_at=due_at)
        contacts = [
            row[0]
            for row in conn.execute("SELECT id FROM contacts ORDER BY random() LIMIT %s", (samples + 10,))
        ]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    context = multiprocessing.get_context("spawn")
    ready, go, stop = context.Semaphore(0), context.Event(), context.Event()
    worker = context.Process(target=release_bench._steady_worker, args=(url, ready, go, stop, True))
    worker.start()
    try:
        ready.acquire()
        time.sleep(0.5)
        assert worker.pid is not None
        baseline = rss_mb(worker.pid)
        go.set()
        stop_latency(url, project_id, contacts[:10])  # warm-up: caches, prepared statements
        cancel_ms = stop_latency(url, project_id, contacts[10:])
        rss, _ = _settle(lambda: (rss_mb(worker.pid or 0), 0), seconds=3.0, timeout=30.0)
    finally:
        stop.set()
        go.set()
        worker.join(timeout=60)
        if worker.is_alive():
            worker.kill()
    with psycopg.connect(url) as conn:
        active = conn.execute("SELECT count(*) FROM followup_enrollments WHERE status = 'active'").fetchone()
    assert active is not None and active[0] == pending - samples - 10, f"{active} active"
    print(
        f"  release worker (its polling loop) with {pending:,} follow-ups pending: RSS {baseline:.1f} MB"
        f" before, {rss:.1f} MB running"
    )
    print(f"  cancel by our stop path (lock the contact, stop, COMMIT): {cancel_ms:.2f} ms median")
    return {"rss_before": baseline, "rss": rss, "cancel_ms": cancel_ms}


def _first_to_last(url: str) -> float:
    """Steps/s of the last release run from its first to its last step run (``ran_at``: the claim's time)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(ran_at) - min(ran_at)) FROM followup_step_runs"
        ).fetchone()
    assert row is not None
    return (int(row[0]) - 1) / float(row[1]) if row[1] else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", "--jobs", type=int, default=20_000, help="steps / jobs of the throughput runs")
    parser.add_argument("-w", "--workers", type=int, default=4, help="our workers / PgQueuer's consumers")
    parser.add_argument("--rounds", type=int, default=3, help="ours/PgQueuer runs in turn")
    parser.add_argument("--batch-size", type=int, default=1, help="PgQueuer's batch size")
    parser.add_argument(
        "--max-concurrent-tasks", type=int, default=None, help="PgQueuer's per-process cap (default none)"
    )
    parser.add_argument("--pending", type=int, default=100_000, help="pending follow-ups")
    parser.add_argument("--delay-hours", type=float, default=2.0, help="when the pending ones fall due")
    parser.add_argument("--threads", type=int, default=8, help="the Dramatiq worker's threads")
    parser.add_argument("--samples", type=int, default=100, help="cancellations timed")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke test")
    parser.add_argument(
        "--throughput-only", action="store_true", help="ours against PgQueuer only (and its line's keys)"
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds, args.pending, args.samples = 500, 1, 2_000, 20

    print(
        f"peers benchmark: {args.jobs:,} steps/jobs with {args.workers} processes x {args.rounds} rounds;"
        f" {args.pending:,} pending follow-ups"
    )
    with bench_database(BENCH_DATABASE) as url:
        ours_runs: list[float] = []
        ours_first_last: list[float] = []
        pgq_runs: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            ours_runs.append(release_bench.run_release(url, args.jobs, args.workers)[0])
            ours_first_last.append(_first_to_last(url))
            pgq_runs.append(
                run_pgqueuer(url, args.jobs, args.workers, args.batch_size, args.max_concurrent_tasks)
            )
        ours = statistics.median(ours_runs)
        pgq = statistics.median(first_last for first_last, _ in pgq_runs)
        ratio = statistics.median(o / p[0] for o, p in zip(ours_runs, pgq_runs, strict=True))
        in_turn = " ".join(f"{o:.0f}/{p[0]:.0f}" for o, p in zip(ours_runs, pgq_runs, strict=True))
        print(
            f"  ours, a full step per transaction ({args.workers} processes): {ours:.0f} steps/s from the"
            f" start signal to the last exit ({statistics.median(ours_first_last):.0f} first to last claim)"
        )
        print(
            f"  PgQueuer, one-insert jobs ({args.workers} processes, batch size {args.batch_size}):"
            f" {pgq:.0f} jobs/s first to last completion"
            f" ({statistics.median(wall for _, wall in pgq_runs):.0f} from the start signal to the last exit)"
        )
        print(f"  runs in turn (ours/PgQueuer): {in_turn}")
        if args.throughput_only:
            print(f"peers: ours_steps_per_s={ours:.0f} pgqueuer_jobs_per_s={pgq:.0f} ratio={ratio:.2f}")
            return

        print(f"Dramatiq, {args.pending:,} delayed messages on RabbitMQ:")
        peer = run_dramatiq(url, args.pending, args.delay_hours, args.threads, args.samples)
        print(f"ours, {args.pending:,} enrollments pending:")
        mine = run_ours_pending(url, args.pending, args.delay_hours, args.samples)
    print(
        f"peers: ours_steps_per_s={ours:.0f} pgqueuer_jobs_per_s={pgq:.0f} ratio={ratio:.2f}"
        f" dramatiq_rss_mb_100k={peer['rss']:.0f} ours_rss_mb_100k={mine['rss']:.0f}"
        f" dramatiq_held={peer['held']} dramatiq_mark_cancel_ms={peer['mark_cancel_ms']:.2f}"
        f" dramatiq_cancel_ms={peer['cancel_ms']:.0f} ours_cancel_ms={mine['cancel_ms']:.2f}"
    )


if __name__ == "__main__":
    main()
