"""`make bench-outbox`: how fast the outbox relay drains a backlog into RabbitMQ, a batch's confirms waited
for together against one confirm at a time.

In a database of its own (``followups_bench_outbox`` on DATABASE_URL's server), each run fills the outbox
anew with N events (``-n``, 100,000) over A aggregates (``--aggregates``, 10,000 enrollments: each event's
enrollment drawn at random, its ``step_index`` counting that enrollment's events), written through
``write_events`` a thousand at a time, their ``occurred_at`` spread over the minute before the run (oldest
first), then vacuumed and analysed. The relay (``OutboxRelay``, the relay loop's tick, batches of
``--batch`` = 500 rows) is called until it has relayed what the run asks, as the loop calls it while it has
work, publishing to a topic exchange of the benchmark's own on RabbitMQ (``AMQP_URL``;
``followups.events.bench``, so that nothing bound to the product's exchange receives the flood) with one
durable queue bound to every event (a classic queue; ``--queue-type quorum`` for a quorum one). The queue is
purged before each run, and it and the exchange are deleted afterwards. A run's rate is the events relayed
over the time from its first batch to its last, and the queue must then hold every one of them.

Two ways, in turn for R rounds (``--rounds``, 3; which goes first alternates, so that a slow spell of the
machine falls on both alike):

- after: the relay as it is, each batch published whole and its confirms awaited together
  (``AmqpPublisher()``); it drains all N;
- before: one confirm awaited after each message before the next is published (``AmqpPublisher(
  confirm_window=1)``: what ``BlockingChannel.basic_publish`` in confirm mode did, a round trip and one of
  RabbitMQ's disk writes a message). It relays the first ``--before-events`` (10,000) of the same N: its rate
  does not depend on how many (a message at a time), and all N would take minutes a run.

Each way prints the median of its runs; the ratio is the median of the rounds' ratios.

The backlog gauge (``followups_outbox_oldest_unpublished_seconds``, set by the relay from each batch it
reads) is watched while each run drains: every 200 ms a thread reads the true age of the oldest
unpublished event from PostgreSQL, and the gauge just before and just after. It is honest when it never
reads 0 while events wait, the truth is never further from what it read over that time than the age one
batch of events spans plus what two batches take (one published since it was set, one being read), and at
the end of a run it reads 0 when the outbox is empty (or the truth, within that bound, when events are
left). The last run of ``after`` also reads the queue back and checks that each enrollment's events arrived
in ``step_index`` order. The benchmark exits 1 when the gauge was not honest.

The last line is ``outbox: relayed_per_s=<n> before_per_s=<n> ratio=<r>``; target: 5,000 a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pika
import psycopg
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from benchmarks.common import bench_database
from libs.common.contracts.events import StepQueued
from libs.common.core.db import create_pool
from libs.common.core.outbox import QUERIES, AmqpPublisher, OutboxRelay, write_events
from libs.common.core.settings import DatabaseSettings

BENCH_DATABASE = "followups_bench_outbox"
EXCHANGE = "followups.events.bench"
GAUGE = "followups_outbox_oldest_unpublished_seconds"

#: How far apart in time the events were written: the backlog's oldest is a minute old when a run starts.
SPREAD = timedelta(seconds=60)

#: How often the gauge is compared with the truth (the truth is a query of the outbox: not too often).
SAMPLE_EVERY = 0.2


def amqp_url() -> str:
    return os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


@dataclasses.dataclass
class Run:
    per_s: float
    relayed: int
    batches: int
    #: the gauge: samples taken, how far the furthest was from the truth, the bound it must keep
    samples: int = 0
    max_off_s: float = 0.0
    bound_s: float = 0.0
    zero_while_waiting: int = 0
    #: the gauge once the run stopped: 0 when the outbox is empty, else within the bound of the truth
    end_honest: bool = False

    @property
    def honest(self) -> bool:
        return self.end_honest and not self.zero_while_waiting and self.max_off_s <= self.bound_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("-n", "--events", type=int, default=100_000, help="events in the outbox each run")
    parser.add_argument("--aggregates", type=int, default=10_000, help="enrollments the events belong to")
    parser.add_argument("--batch", type=int, default=500, help="the relay's batch (rows read at a time)")
    parser.add_argument(
        "--before-events",
        type=int,
        default=10_000,
        help="events the one-confirm-at-a-time run relays of the N (0: all of them)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="before/after runs in turn")
    parser.add_argument("--queue-type", choices=("classic", "quorum"), default="classic")
    parser.add_argument("--database", default=BENCH_DATABASE)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    print(
        f"outbox benchmark: {args.events:,} events over {args.aggregates:,} enrollments, batches of"
        f" {args.batch}, {args.rounds} rounds, a {args.queue_type} queue",
        flush=True,
    )
    ways = {"after": None, "before": 1}  # the confirm window: the whole batch, or one message
    drains = {"after": args.events, "before": min(args.before_events or args.events, args.events)}
    runs: dict[str, list[Run]] = {way: [] for way in ways}
    with bench_database(args.database) as url, _queue(args.queue_type) as queue:
        pool = create_pool(DatabaseSettings(url=url, pool_min_size=2, pool_max_size=4), name="bench-outbox")
        try:
            for round_ in range(args.rounds):
                order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
                for way in order:
                    last = round_ == args.rounds - 1 and way == "after"
                    run = _run(pool, url, queue, args, window=ways[way], drain=drains[way], check_order=last)
                    runs[way].append(run)
                    print(
                        f"  round {round_ + 1} {way}: {run.per_s:,.0f} events/s over {run.relayed:,}"
                        f" ({run.batches} batches); gauge: {run.samples} samples, at most"
                        f" {run.max_off_s:.2f} s off (bound {run.bound_s:.2f} s), 0 while events waited"
                        f" {run.zero_while_waiting} times, at the end"
                        f" {'right' if run.end_honest else 'WRONG'}",
                        flush=True,
                    )
        finally:
            pool.close()
    after = statistics.median(r.per_s for r in runs["after"])
    before = statistics.median(r.per_s for r in runs["before"])
    ratio = statistics.median(a.per_s / b.per_s for a, b in zip(runs["after"], runs["before"], strict=True))
    honest = all(r.honest for way in runs.values() for r in way)
    print(f"  after (a batch's confirms together): {after:,.0f} events/s, median of {args.rounds}")
    print(
        f"  before (one confirm at a time, the first {drains['before']:,} of the {args.events:,}):"
        f" {before:,.0f} events/s, median of {args.rounds}"
    )
    print(f"  backlog gauge honest in every run: {'yes' if honest else 'NO'}")
    print(f"outbox: relayed_per_s={after:.0f} before_per_s={before:.0f} ratio={ratio:.2f}")
    if not honest:
        raise SystemExit(1)


class _queue:
    """The benchmark's exchange and a durable queue bound to every event on it; both deleted afterwards."""

    def __init__(self, queue_type: str) -> None:
        self.name = f"bench-outbox-{uuid.uuid4().hex[:8]}"
        self.arguments = {"x-queue-type": queue_type}
        self.connection = pika.BlockingConnection(pika.URLParameters(amqp_url()))
        self.channel = self.connection.channel()

    def __enter__(self) -> _queue:
        self.channel.exchange_declare(EXCHANGE, exchange_type="topic", durable=True)
        self.channel.queue_declare(self.name, durable=True, arguments=self.arguments)
        self.channel.queue_bind(self.name, EXCHANGE, routing_key="#")
        return self

    def __exit__(self, *_: object) -> None:
        self.channel.queue_delete(self.name)
        self.channel.exchange_delete(EXCHANGE)
        self.connection.close()

    def purge(self) -> None:
        self.channel.queue_purge(self.name)

    def count(self) -> int:
        return int(self.channel.queue_declare(self.name, passive=True).method.message_count)

    def check_order(self, events: int) -> None:
        """Read every event back: each enrollment's arrive in ``step_index`` order, none is missing."""
        decode = msgspec.json.Decoder().decode
        last: dict[str, int] = {}
        seen = 0
        self.channel.basic_qos(prefetch_count=2000)
        for method, _properties, body in self.channel.consume(self.name, inactivity_timeout=5):
            if method is None:
                break
            envelope: dict[str, Any] = decode(body)
            step = envelope["data"]["step_index"]
            if step != last.get(envelope["subject"], -1) + 1:
                raise SystemExit(f"out of order: {envelope['subject']} step {step} after {last}")
            last[envelope["subject"]] = step
            seen += 1
            if seen % 2000 == 0 or seen == events:
                self.channel.basic_ack(method.delivery_tag, multiple=True)
            if seen == events:
                break
        self.channel.cancel()
        if seen != events:
            raise SystemExit(f"read back {seen} of {events} events")
        print(f"  read back: {seen:,} events, each enrollment's in order", flush=True)


def _fill(pool: ConnectionPool, url: str, events: int, aggregates: int) -> None:
    """N events over A enrollments, oldest first, a minute apart from first to last."""
    rng = random.Random(27)
    enrollments = [uuid.uuid4() for _ in range(aggregates)]
    steps = [0] * aggregates
    project = uuid.uuid4()
    start = datetime.now(UTC) - SPREAD
    with pool.connection() as conn:
        conn.execute("TRUNCATE outbox")
        for first in range(0, events, 1000):
            chunk = []
            for _ in range(min(1000, events - first)):
                a = rng.randrange(aggregates)
                chunk.append(
                    StepQueued(
                        enrollment_id=enrollments[a],
                        sequence_id=None,
                        contact_id=enrollments[a],
                        step_index=steps[a],
                        message_id=uuid.uuid4(),
                        reason=None,
                    )
                )
                steps[a] += 1
            write_events(conn, project, chunk, occurred_at=start + SPREAD * first / events)
            conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox")


class _GaugeWatch:
    """Every :data:`SAMPLE_EVERY` seconds, the true age of the oldest unpublished event, and the backlog
    gauge just before and just after it was read: the relay goes on meanwhile (a batch every few tens of
    milliseconds, each making the truth younger by the age one batch spans), so the truth is compared with
    what the gauge said over the time it took to read."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.samples: list[tuple[float, float, float | None]] = []  # gauge before, gauge after, truth
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gauge-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self.pool.connection() as conn:
            conn.autocommit = True
            while not self._stop.wait(SAMPLE_EVERY):
                before = REGISTRY.get_sample_value(GAUGE) or 0.0
                row = conn.execute(QUERIES["oldest_unpublished_age"]).fetchone()
                after = REGISTRY.get_sample_value(GAUGE) or 0.0
                self.samples.append((before, after, float(row[0]) if row else None))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _run(
    pool: ConnectionPool,
    url: str,
    queue: _queue,
    args: argparse.Namespace,
    *,
    window: int | None,
    drain: int,
    check_order: bool,
) -> Run:
    """Fill the outbox with ``args.events`` events and relay ``drain`` of them (all of them, or the first
    ``--before-events`` one confirm at a time)."""
    _fill(pool, url, args.events, args.aggregates)
    queue.purge()
    publisher = AmqpPublisher(amqp_url(), EXCHANGE, confirm_window=window)
    relay = OutboxRelay(pool, publisher, limit=args.batch)
    batches, relayed, longest = 0, 0, 0.0
    watch: _GaugeWatch | None = None
    started = time.monotonic()
    try:
        while relayed < drain:
            began = time.monotonic()
            done = relay()
            longest = max(longest, time.monotonic() - began)
            if not done:
                raise SystemExit("the relay published nothing with events waiting (RabbitMQ unreachable?)")
            relayed += done
            batches += 1
            if watch is None:  # the gauge is set from the first batch on
                watch = _GaugeWatch(pool)
        elapsed = time.monotonic() - started
    finally:
        if watch is not None:
            watch.stop()
        publisher.close()
    gauge_after = REGISTRY.get_sample_value(GAUGE) or 0.0
    truth_after = _oldest_waiting(pool)
    deadline = time.monotonic() + 10
    while (held := queue.count()) < relayed and time.monotonic() < deadline:
        time.sleep(0.1)
    if held != relayed:
        raise SystemExit(f"the queue holds {held} of the {relayed} events relayed")
    run = Run(per_s=relayed / elapsed, relayed=relayed, batches=batches)
    run.bound_s = SPREAD.total_seconds() * args.batch / args.events + 2 * longest
    assert watch is not None
    waiting = [(min(g1, g2), max(g1, g2), truth) for g1, g2, truth in watch.samples if truth is not None]
    run.samples = len(waiting)
    run.max_off_s = max((max(low - truth, truth - high, 0.0) for low, high, truth in waiting), default=0.0)
    run.zero_while_waiting = sum(1 for low, _, _ in waiting if low == 0.0)
    if truth_after is None:  # drained: the gauge must say that nothing waits
        run.end_honest = gauge_after == 0.0
    else:
        run.end_honest = gauge_after != 0.0 and abs(gauge_after - truth_after) <= run.bound_s
    if check_order:
        queue.check_order(args.events)
    return run


def _oldest_waiting(pool: ConnectionPool) -> float | None:
    with pool.connection() as conn:
        row = conn.execute(QUERIES["oldest_unpublished_age"]).fetchone()
    return float(row[0]) if row else None


if __name__ == "__main__":
    main()
