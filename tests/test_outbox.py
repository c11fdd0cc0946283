"""The transactional outbox and its relay."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import pytest
from psycopg_pool import ConnectionPool

from libs.common.contracts.events import Event
from libs.common.core.clock import ManualClock
from libs.common.core.outbox import AmqpPublisher, Envelope, LogPublisher, relay_batch, write_events
from tests.conftest import Project
from tests.helpers import EventsConsumer


class Happened(Event, kw_only=True, frozen=True):
    """An event of the tests' own: the n-th thing that happened to one aggregate."""

    type: ClassVar[str] = "test.happened"
    aggregate_type: ClassVar[str] = "thing"

    thing_id: uuid.UUID
    seq: int

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.thing_id


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
    with pytest.raises(ConnectionError):
        relay_batch(pool, failing)
    assert failing.attempts == 1
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
