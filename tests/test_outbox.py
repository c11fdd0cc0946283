"""The transactional outbox and its relay."""

from __future__ import annotations

import logging
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.outbox import (
    RELAY_LOCK_KEY,
    AmqpPublisher,
    Envelope,
    LogPublisher,
    OutboxRelay,
    PublishFailed,
    relay_batch,
    write_events,
)
from tests.conftest import Project
from tests.helpers import EventsConsumer, rows
from tests.outbox_helpers import Happened
from tests.tcp_proxy import TcpProxy


def write(pool: ConnectionPool, clock: ManualClock, project: Project, aggregate: uuid.UUID, n: int) -> None:
    """``n`` events of one aggregate: one transaction each, but the first two in one statement."""
    with pool.connection() as conn:
        events = [Happened(thing_id=aggregate, seq=i) for i in range(n)]
        write_events(conn, project.id, events[:2], occurred_at=clock.now())
        for event in events[2:]:
            conn.commit()
            write_events(conn, project.id, [event], occurred_at=clock.now())


class FailingPublisher:
    def __init__(self) -> None:
        self.attempts = 0

    def publish(self, envelopes: list[Envelope]) -> None:
        self.attempts += 1
        raise ConnectionError("broker down")

    def close(self) -> None:
        pass


def test_relay_publishes_in_order_once(pool: ConnectionPool, clock: ManualClock, project: Project) -> None:
    aggregate = uuid.uuid4()
    write(pool, clock, project, aggregate, 5)
    publisher = LogPublisher()
    assert relay_batch(pool, publisher) == 5
    assert relay_batch(pool, publisher) == 0
    assert [e.data["seq"] for e in publisher.published] == [0, 1, 2, 3, 4]
    assert {e.subject for e in publisher.published} == {f"thing/{aggregate}"}
    assert len({e.id for e in publisher.published}) == 5


def test_an_event_written_in_a_rolled_back_transaction_is_never_published(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given a committed control event and one written in a transaction that rolls back
    with pool.connection() as conn:
        write_events(conn, project.id, [Happened(thing_id=uuid.uuid4(), seq=1)], occurred_at=clock.now())
    with pool.connection() as conn:
        write_events(conn, project.id, [Happened(thing_id=uuid.uuid4(), seq=2)], occurred_at=clock.now())
        conn.rollback()
    # When the relay runs, Then only the committed one is published
    publisher = LogPublisher()
    assert relay_batch(pool, publisher) == 1
    assert [e.data["seq"] for e in publisher.published] == [1]
    assert relay_batch(pool, publisher) == 0


def test_a_failed_publish_keeps_the_events_for_the_next_run(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    write(pool, clock, project, uuid.uuid4(), 3)
    failing = FailingPublisher()
    with pytest.raises(PublishFailed):
        relay_batch(pool, failing)
    assert failing.attempts == 1
    assert rows(pool, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == [(0,)]
    publisher = LogPublisher()
    assert relay_batch(pool, publisher) == 3
    assert [e.data["seq"] for e in publisher.published] == [0, 1, 2]


def test_only_one_relay_publishes_at_a_time(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    write(pool, clock, project, uuid.uuid4(), 2)
    with pool.connection() as holder:
        holder.execute("SELECT pg_advisory_xact_lock(7301552019)")
        assert relay_batch(pool, LogPublisher()) == 0
    assert relay_batch(pool, LogPublisher()) == 2


class Inspecting:
    """A publisher that looks, while it publishes, at what the relay holds in PostgreSQL."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.seen: list[tuple[Any, ...]] = []

    def publish(self, envelopes: list[Envelope]) -> None:
        self.seen = rows(
            self.pool,
            """
            SELECT a.state, l.objid IS NOT NULL
            FROM pg_stat_activity a
            LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
            WHERE a.application_name = 'followups-test' AND a.pid <> pg_backend_pid()
              AND a.datname = current_database() AND a.state <> 'idle' OR l.objid IS NOT NULL
            """,
        )

    def close(self) -> None:
        pass


def test_the_relay_publishes_outside_any_transaction_holding_only_its_lock(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    """A slow or stalled RabbitMQ must not keep a transaction open (rows locked, a snapshot held): while
    the relay publishes, its connection is idle, not idle in transaction, and holds only the session lock."""
    write(pool, clock, project, uuid.uuid4(), 3)
    inspecting = Inspecting(pool)
    assert relay_batch(pool, inspecting) == 3
    assert inspecting.seen == [("idle", True)]
    # the lock is released after the batch, and the events are marked
    assert rows(pool, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == [(0,)]
    assert rows(pool, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [(0,)]


def test_another_session_holding_the_relay_lock_keeps_the_relay_out(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    """The relay lock is session-level: a relay between its read and its mark (publishing, no transaction
    open) keeps every other relay out."""
    write(pool, clock, project, uuid.uuid4(), 2)
    with pool.connection() as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (RELAY_LOCK_KEY,))
        holder.commit()
        assert relay_batch(pool, LogPublisher()) == 0
        holder.execute("SELECT pg_advisory_unlock(%s)", (RELAY_LOCK_KEY,))
    assert relay_batch(pool, LogPublisher()) == 2


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    pool: ConnectionPool, clock: ManualClock, project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="libs.common.core.outbox")
    write(pool, clock, project, uuid.uuid4(), 2)
    failing = FailingPublisher()
    relay = OutboxRelay(pool, failing)
    # the relay loop's tick: a failed publish is no error for the loop (it polls again), and is logged once
    assert [relay(), relay(), relay()] == [0, 0, 0]
    assert failing.attempts == 3
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "libs.common.core.outbox"]
    assert logged == [("WARNING", "RabbitMQ unreachable: domain events wait in the outbox until it answers")]
    relay = OutboxRelay(pool, LogPublisher())
    relay.outage.failed(ConnectionError("broker down"))  # as the failing relay left it
    caplog.clear()
    assert relay() == 2
    assert relay() == 0
    logged = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "libs.common.core.outbox" and r.getMessage() != "event"  # LogPublisher's own
    ]
    assert logged == [("INFO", "RabbitMQ answers again")]


@pytest.mark.rabbitmq
def test_amqp_relay_delivers_events_of_an_aggregate_in_order(
    pool: ConnectionPool, clock: ManualClock, project: Project, amqp_url: str
) -> None:
    exchange = f"followups.events.test.{uuid.uuid4().hex[:8]}"
    consumer = EventsConsumer(amqp_url, exchange, ("test.#",))
    publisher = AmqpPublisher(amqp_url, exchange)
    try:
        aggregate = uuid.uuid4()
        write(pool, clock, project, aggregate, 20)
        published = 0
        while published < 20:
            published += relay_batch(pool, publisher, limit=7)
        seen: list[Any] = []

        def all_seen(key: str, envelope: dict[str, Any]) -> bool:
            seen.append(envelope["data"]["seq"])
            return len(seen) == 20

        consumer.wait_for(all_seen)
        assert seen == list(range(20))
        routing_keys = {key for key, _ in consumer.received}
        assert routing_keys == {"test.happened"}
        assert all(env["project_id"] == str(project.id) for _, env in consumer.received)
    finally:
        publisher.close()
        consumer.close()


@pytest.mark.rabbitmq
def test_a_stalled_broker_times_the_publish_out_and_the_events_go_when_it_answers_again(
    pool: ConnectionPool, clock: ManualClock, project: Project, amqp_url: str
) -> None:
    """A RabbitMQ that stops answering (an alarm blocks its publishers): the publish gives up after its
    timeout, the events stay in the outbox, and go out in order once it answers (at least once: the
    message whose confirm never came may arrive twice)."""
    exchange = f"followups.events.test.{uuid.uuid4().hex[:8]}"
    consumer = EventsConsumer(amqp_url, exchange, ("test.#",))
    target = urlsplit(amqp_url)
    with TcpProxy((target.hostname or "127.0.0.1", target.port or 5672)) as proxy:
        proxied = target._replace(
            netloc=f"{target.username}:{target.password}@127.0.0.1:{proxy.port}"
        ).geturl()
        publisher = AmqpPublisher(proxied, exchange, timeout=0.5)
        try:
            aggregate = uuid.uuid4()
            write(pool, clock, project, aggregate, 3)
            assert relay_batch(pool, publisher) == 3  # connected and publishing
            write_more = [Happened(thing_id=aggregate, seq=i) for i in range(3, 10)]
            with pool.connection() as conn:
                write_events(conn, project.id, write_more, occurred_at=clock.now())
            # When RabbitMQ stops answering
            proxy.stall()
            with pytest.raises(PublishFailed):
                relay_batch(pool, publisher)  # the open connection: no confirm within the timeout
            with pytest.raises(PublishFailed):
                relay_batch(pool, publisher)  # a new connection: no handshake within the timeout
            assert rows(pool, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [(7,)]
            # Then once it answers again, the rest goes, in order
            proxy.resume()
            assert relay_batch(pool, publisher) == 7
        finally:
            publisher.close()
    try:
        first_seen: list[int] = []

        def all_seen(key: str, envelope: dict[str, Any]) -> bool:
            if envelope["data"]["seq"] not in first_seen:
                first_seen.append(envelope["data"]["seq"])
            return len(first_seen) == 10

        consumer.wait_for(all_seen)
    finally:
        consumer.close()
    assert first_seen == list(range(10))
