"""The relay's batches on RabbitMQ: a batch is published whole and its confirms are awaited together; its
rows are marked only once every message of it is confirmed, so a nack or a connection lost mid-batch marks
none of them and the batch goes again (duplicates allowed, losses not); each aggregate's events arrive in
the order they were written. And the backlog gauge tells the truth while a backlog drains."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pika
import pytest
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core import confirms
from libs.common.core.clock import ManualClock
from libs.common.core.outbox import (
    AmqpPublisher,
    Envelope,
    LogPublisher,
    PublishFailed,
    relay_batch,
    write_events,
)
from tests.conftest import Project
from tests.helpers import EventsConsumer, rows
from tests.outbox_helpers import Happened
from tests.tcp_proxy import TcpProxy

GAUGE = "followups_outbox_oldest_unpublished_seconds"


def write_interleaved(
    pool: ConnectionPool, clock: ManualClock, project: Project, things: int, each: int, *, seed: int = 27
) -> list[uuid.UUID]:
    """``each`` events of each of ``things`` aggregates, the aggregates drawn at random, a transaction for
    one to three events (of the same or of different aggregates)."""
    rng = random.Random(seed)
    ids = [uuid.uuid4() for _ in range(things)]
    left = {thing: each for thing in ids}
    seq = dict.fromkeys(ids, 0)
    with pool.connection() as conn:
        while left:
            events = []
            for _ in range(rng.randint(1, 3)):
                if not left:
                    break
                thing = rng.choice(sorted(left))
                events.append(Happened(thing_id=thing, seq=seq[thing]))
                seq[thing] += 1
                left[thing] -= 1
                if not left[thing]:
                    del left[thing]
            write_events(conn, project.id, events, occurred_at=clock.now())
            conn.commit()
    return ids


def unpublished(pool: ConnectionPool) -> int:
    count: int = rows(pool, "SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0]
    return count


def drain(pool: ConnectionPool, publisher: Any, *, limit: int) -> int:
    published = 0
    while batch := relay_batch(pool, publisher, limit=limit):
        published += batch
    return published


def receive(consumer: EventsConsumer, pool: ConnectionPool) -> dict[str, list[int]]:
    """Every event of the outbox received (at least once); each aggregate's ``seq`` in the order of their
    first delivery."""
    expected = {str(row[0]) for row in rows(pool, "SELECT event_id FROM outbox")}
    seen: set[str] = set()
    firsts: dict[str, list[int]] = {}

    def all_seen(key: str, envelope: dict[str, Any]) -> bool:
        if envelope["id"] not in seen:
            seen.add(envelope["id"])
            firsts.setdefault(envelope["subject"], []).append(envelope["data"]["seq"])
        return seen >= expected

    consumer.wait_for(all_seen)
    return firsts


def in_order(firsts: dict[str, list[int]], things: int, each: int) -> None:
    assert len(firsts) == things
    assert all(seqs == list(range(each)) for seqs in firsts.values()), firsts


@pytest.fixture
def exchange() -> str:
    return f"followups.events.test.{uuid.uuid4().hex[:8]}"


class Watched:
    """What the relay's confirm window saw at each answer from RabbitMQ: (published, confirmed, rows left
    unmarked in the outbox)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, pool: ConnectionPool) -> None:
        self.answers: list[tuple[int, int, int]] = []
        self.most_unconfirmed = 0
        answer = confirms.ConfirmWindow._on_answer

        def on_answer(window: confirms.ConfirmWindow, frame: Any) -> None:
            self.most_unconfirmed = max(self.most_unconfirmed, window.unconfirmed)
            answer(window, frame)
            self.answers.append((window.published, window.confirmed, unpublished(pool)))

        monkeypatch.setattr(confirms.ConfirmWindow, "_on_answer", on_answer)


@pytest.mark.rabbitmq
def test_a_batch_is_published_whole_and_marked_only_once_every_message_is_confirmed(
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    amqp_url: str,
    exchange: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 300 events of 30 aggregates in the outbox
    write_interleaved(pool, clock, project, things=30, each=10)
    consumer = EventsConsumer(amqp_url, exchange, ("test.#",))
    publisher = AmqpPublisher(amqp_url, exchange)
    watched = Watched(monkeypatch, pool)
    marked_when_confirmed: list[int] = []
    publish = publisher.publish

    def publish_and_look(envelopes: list[Envelope]) -> None:
        publish(envelopes)
        marked_when_confirmed.append(unpublished(pool))

    publisher.publish = publish_and_look  # type: ignore[method-assign]
    try:
        # When the relay publishes them as one batch
        assert relay_batch(pool, publisher, limit=300) == 300
        # Then the messages went out without waiting for each one's confirm: a chunk of them at least was
        # unconfirmed when RabbitMQ's first answer was read
        assert watched.most_unconfirmed >= confirms.WRITE_CHUNK
        # and no row was marked before the last confirm: every answer came with the 300 rows unmarked, the
        # publish returned with every message confirmed and still none marked; then all of them were
        assert all(left == 300 for _, _, left in watched.answers)
        assert watched.answers[-1][:2] == (300, 300)
        assert marked_when_confirmed == [300]
        assert unpublished(pool) == 0
        in_order(receive(consumer, pool), things=30, each=10)
    finally:
        publisher.close()
        consumer.close()


@pytest.mark.rabbitmq
@pytest.mark.parametrize("confirm_window", [None, 1, 7])
def test_each_aggregate_arrives_in_order_across_batches(
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    amqp_url: str,
    exchange: str,
    confirm_window: int | None,
) -> None:
    """Events leave in id order, a batch after the other, and each batch in order on one channel: 40
    aggregates of 15 events each, interleaved, relayed 100 at a time (the batch's confirms together, one at
    a time, or 7 unconfirmed at most), arrive each aggregate in its order, and in the outbox's order."""
    write_interleaved(pool, clock, project, things=40, each=15)
    consumer = EventsConsumer(amqp_url, exchange, ("test.#",))
    publisher = AmqpPublisher(amqp_url, exchange, confirm_window=confirm_window)
    try:
        assert drain(pool, publisher, limit=100) == 600
        in_order(receive(consumer, pool), things=40, each=15)
        outbox_order = [str(row[0]) for row in rows(pool, "SELECT event_id FROM outbox ORDER BY id")]
        assert [envelope["id"] for _, envelope in consumer.received] == outbox_order
    finally:
        publisher.close()
        consumer.close()


@pytest.mark.rabbitmq
def test_a_nacked_message_marks_nothing_of_its_batch_and_the_batch_goes_again(
    pool: ConnectionPool, clock: ManualClock, project: Project, amqp_url: str, exchange: str
) -> None:
    # Given a consumer's queue and a queue that refuses (nacks) what exceeds its 5 messages, both bound
    consumer = EventsConsumer(amqp_url, exchange, ("test.#",))
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    full = f"test-full-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(full, arguments={"x-max-length": 5, "x-overflow": "reject-publish"})
    channel.queue_bind(full, exchange, routing_key="#")
    write_interleaved(pool, clock, project, things=4, each=5)
    publisher = AmqpPublisher(amqp_url, exchange)
    try:
        # When the relay publishes the 20 events as one batch, Then RabbitMQ nacks 15 and none is marked
        with pytest.raises(PublishFailed, match="Nacked"):
            relay_batch(pool, publisher)
        assert unpublished(pool) == 20
        assert rows(pool, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == [(0,)]
        # Then once the queue takes them again, the whole batch goes again: every event arrives at least
        # once (the 20 of the first try were routed to the consumer's queue too: duplicates), in order
        channel.queue_delete(full)
        assert relay_batch(pool, publisher) == 20
        assert unpublished(pool) == 0
        in_order(receive(consumer, pool), things=4, each=5)
    finally:
        publisher.close()
        connection.close()
        consumer.close()


@pytest.mark.rabbitmq
@pytest.mark.parametrize(
    ("confirm_window", "drop_after_answers"),
    [(None, 0), (50, 1)],
    ids=["before-any-confirm", "after-some-confirms"],
)
def test_a_connection_lost_mid_batch_marks_nothing_and_the_batch_goes_again(
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    amqp_url: str,
    exchange: str,
    monkeypatch: pytest.MonkeyPatch,
    confirm_window: int | None,
    drop_after_answers: int,
) -> None:
    """The connection drops while a batch of 300 is published: at the first answer from RabbitMQ, before it
    is read, or (50 unconfirmed at most) at the second, once some are confirmed. Nothing of the batch is
    marked; the next run publishes the whole batch again on a new connection."""
    write_interleaved(pool, clock, project, things=30, each=10)
    consumer = EventsConsumer(amqp_url, exchange, ("test.#",))
    target = urlsplit(amqp_url)
    answers: list[int] = []
    dropped_at: list[tuple[int, int]] = []  # (published, confirmed)
    answer = confirms.ConfirmWindow._on_answer
    with TcpProxy((target.hostname or "127.0.0.1", target.port or 5672)) as proxy:

        def on_answer(window: confirms.ConfirmWindow, frame: Any) -> None:
            if dropped_at:
                return  # read with the one that dropped the connection: lost with it
            if len(answers) == drop_after_answers:
                dropped_at.append((window.published, window.confirmed))
                proxy.down()  # RabbitMQ is gone: this answer and every later one is lost
                return
            answer(window, frame)
            answers.append(window.confirmed)

        monkeypatch.setattr(confirms.ConfirmWindow, "_on_answer", on_answer)
        proxied = target._replace(
            netloc=f"{target.username}:{target.password}@127.0.0.1:{proxy.port}"
        ).geturl()
        publisher = AmqpPublisher(proxied, exchange, timeout=2, confirm_window=confirm_window)
        try:
            with pytest.raises(PublishFailed):
                relay_batch(pool, publisher, limit=300)
            [(published, confirmed)] = dropped_at
            assert len(answers) == drop_after_answers
            assert 0 < published <= 300
            assert (confirmed > 0) == (drop_after_answers > 0)
            assert confirmed < published
            assert unpublished(pool) == 300
            assert rows(pool, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == [(0,)]
            monkeypatch.setattr(confirms.ConfirmWindow, "_on_answer", answer)
            proxy.up()
            assert relay_batch(pool, publisher, limit=300) == 300
        finally:
            publisher.close()
    try:
        in_order(receive(consumer, pool), things=30, each=10)
    finally:
        consumer.close()


def gauge() -> float:
    value = REGISTRY.get_sample_value(GAUGE)
    assert value is not None
    return value


def oldest_waiting(pool: ConnectionPool) -> float:
    """The truth the gauge stands for: how long the oldest unpublished event has waited."""
    found = rows(
        pool,
        "SELECT extract(epoch FROM now() - occurred_at) FROM outbox WHERE published_at IS NULL"
        " ORDER BY id LIMIT 1",
    )
    return float(found[0][0]) if found else 0.0


def test_the_backlog_gauge_tells_the_oldest_waiting_event_while_a_backlog_drains(
    pool: ConnectionPool, project: Project
) -> None:
    # Given 10 events written a minute apart, the oldest ten minutes ago
    now = datetime.now(UTC)
    with pool.connection() as conn:
        for minute in range(10):
            occurred_at = now - timedelta(minutes=10 - minute)
            write_events(
                conn, project.id, [Happened(thing_id=uuid.uuid4(), seq=minute)], occurred_at=occurred_at
            )
    seen: list[float] = []

    class Looking(LogPublisher):
        def publish(self, envelopes: list[Envelope]) -> None:
            seen.append(gauge())  # while the batch is published it waits still
            super().publish(envelopes)

    # When the relay publishes them 3 at a time, Then while a batch is published the gauge tells its first
    # event's wait, and once the batch is marked the wait of the first one left, until none is left
    publisher = Looking()
    for left in (7, 4, 1, 0):
        truth_before = oldest_waiting(pool)
        relay_batch(pool, publisher, limit=3)
        assert seen[-1] == pytest.approx(truth_before, abs=1.0)
        assert gauge() == pytest.approx(oldest_waiting(pool), abs=1.0)
        assert unpublished(pool) == left
    assert gauge() == 0.0
    assert relay_batch(pool, publisher, limit=3) == 0
    assert gauge() == 0.0
