"""The transactional outbox and its relay to the RabbitMQ topic exchange.

Domain events are written with :func:`write_events` in the transaction that caused them. The relay reads
unpublished rows in id order, publishes each to the topic exchange (routing key = event type) with
publisher confirms, then marks them published. A crash between the two publishes again: delivery is at
least once, and consumers deduplicate on the envelope ``id``. Only one relay publishes at a time (a
transaction-level advisory lock), so events leave in commit order, which keeps them ordered per
aggregate.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

import msgspec
import pika
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.contracts.events import Event
from libs.common.core.metrics import OUTBOX_OLDEST_UNPUBLISHED, OUTBOX_PUBLISHED
from libs.common.core.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.core", "outbox.sql")

#: Advisory lock key held by the relay that is publishing.
RELAY_LOCK_KEY = 7_301_552_019

#: The envelope's ``source``.
EVENT_SOURCE = "followups"


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """One domain event as published (CloudEvents style)."""

    id: uuid.UUID
    type: str
    source: str
    time: datetime
    project_id: uuid.UUID
    subject: str
    data: dict[str, Any]


_encode = msgspec.json.Encoder().encode


def write_events(
    conn: Connection[Any], project_id: uuid.UUID, events: Sequence[Event], *, occurred_at: datetime
) -> None:
    """Record domain events of one project in the caller's transaction, in the order given.

    The one writer of the outbox: each event is one of the structs of :mod:`libs.common.contracts.events`.
    One statement whatever the count, so under a pipeline it costs no round trip of its own.
    """
    if not events:
        return
    rows = [
        {"type": e.type, "aggregate_type": e.aggregate_type, "aggregate_id": e.aggregate_id, "data": e}
        for e in events
    ]
    # one JSON document, encoded here: cheaper than adapting four arrays element by element
    params = {"project_id": project_id, "events": _encode(rows).decode(), "occurred_at": occurred_at}
    conn.execute(QUERIES["insert_events"], params)


class Publisher(Protocol):
    def publish(self, envelopes: list[Envelope]) -> None:
        """Publish every envelope durably, in order, or raise."""
        ...

    def close(self) -> None: ...


class AmqpPublisher:
    """Publishes to a durable RabbitMQ topic exchange with publisher confirms."""

    def __init__(self, url: str, exchange: str) -> None:
        self._params = pika.URLParameters(url)
        self._exchange = exchange
        self._connection: Any = None
        self._channel: Any = None

    def _ensure(self) -> Any:
        if self._channel is None or not self._channel.is_open:
            self.close()
            self._connection = pika.BlockingConnection(self._params)
            self._channel = self._connection.channel()
            self._channel.exchange_declare(self._exchange, exchange_type="topic", durable=True)
            self._channel.confirm_delivery()
        return self._channel

    def publish(self, envelopes: list[Envelope]) -> None:
        try:
            channel = self._ensure()
            for envelope in envelopes:
                channel.basic_publish(
                    self._exchange,
                    envelope.type,
                    _encode(envelope),
                    pika.BasicProperties(
                        content_type="application/json",
                        delivery_mode=pika.DeliveryMode.Persistent,
                        message_id=str(envelope.id),
                        type=envelope.type,
                    ),
                    mandatory=False,
                )
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception:  # closing a broken connection: nothing left to do
                log.debug("closing the AMQP connection failed", exc_info=True)


class LogPublisher:
    """The embedded mode's publisher: no RabbitMQ, each event is logged (and kept for inspection)."""

    def __init__(self, keep: int = 1000) -> None:
        self.published: list[Envelope] = []
        self._keep = keep

    def publish(self, envelopes: list[Envelope]) -> None:
        for envelope in envelopes:
            log.info(
                "event",
                extra={
                    "event_type": envelope.type,
                    "event_id": str(envelope.id),
                    "subject": envelope.subject,
                },
            )
        self.published = (self.published + envelopes)[-self._keep :]

    def close(self) -> None:
        pass


def relay_batch(pool: ConnectionPool, publisher: Publisher, *, limit: int = 500) -> int:
    """Publish one batch of unpublished events in id order; returns how many were published."""
    with pool.connection() as conn:
        locked = conn.execute(QUERIES["try_relay_lock"], {"key": RELAY_LOCK_KEY}).fetchone()
        if not locked or not locked[0]:
            return 0  # another relay is publishing
        rows = conn.execute(QUERIES["unpublished_events"], {"limit": limit}).fetchall()
        if not rows:
            OUTBOX_OLDEST_UNPUBLISHED.set(0)
            return 0
        envelopes = [
            Envelope(
                id=event_id,
                type=type_,
                source=EVENT_SOURCE,
                time=occurred_at,
                project_id=project_id,
                subject=f"{aggregate_type}/{aggregate_id}",
                data=data,
            )
            for _, event_id, type_, project_id, aggregate_type, aggregate_id, data, occurred_at in rows
        ]
        publisher.publish(envelopes)
        conn.execute(QUERIES["mark_published"], {"ids": [row[0] for row in rows]})
        oldest = conn.execute(QUERIES["oldest_unpublished_age"]).fetchone()
        OUTBOX_OLDEST_UNPUBLISHED.set(float(oldest[0]) if oldest else 0.0)
    for envelope in envelopes:
        OUTBOX_PUBLISHED.labels(envelope.type).inc()
    return len(envelopes)
