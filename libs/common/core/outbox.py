"""The transactional outbox and its relay to the RabbitMQ topic exchange.

Domain events are written with :func:`write_events` in the transaction that caused them. The relay
(:func:`relay_batch`) reads a batch of unpublished rows in id order (500), publishes the whole batch to the
topic exchange (routing key = event type) with publisher confirms, waiting for the confirms together
rather than for each message in turn (:class:`AmqpPublisher`), and marks the batch published once every
message of it is confirmed. Anything else (a nack, a lost connection, an answer that does not come, a
crash) marks nothing of the batch: it is published again, whole, by the next run. Delivery is at least
once, and consumers deduplicate on the envelope ``id``; what a crash can duplicate is one batch.

The relay never holds a transaction while it waits on RabbitMQ, and never waits on it for long: it reads
the batch and commits, publishes outside any transaction (every answer bounded by
:data:`~libs.common.core.broker.AMQP_TIMEOUT_SECONDS`), then marks the batch in a short transaction of
its own. A stalled broker thus costs one pooled connection, idle, for the timeout; no row stays locked,
no snapshot is held open against VACUUM.

One relay at a time, so events leave in id order (which keeps them ordered per aggregate): a
**session-level** advisory lock (``pg_try_advisory_lock``), taken before the read and released after the
mark, on the one connection that does both. A transaction-level lock would end with the read's
transaction, before the publish; a lease row would need a clock and an expiry longer than any publish.
A session lock needs neither: it lives exactly as long as the connection, so a relay that dies (or loses
its connection) mid-publish lets the next one take over at once, and that relay's mark cannot succeed
without the lock (the same connection). The lock must not outlive the batch on a pooled connection:
it is released in a ``finally``, and a connection that cannot release it is closed (the server then
drops the lock), never returned to the pool holding it. Two relays can overlap only when the lock holder
lost its connection mid-publish; both then publish the same rows in the same order: duplicates, which
at-least-once allows, never a reordering of first deliveries.

Batches keep each aggregate's order as one message at a time did: a batch is published in id order on one
channel, and RabbitMQ keeps a channel's order into each queue; the next batch is read only once this one is
confirmed and marked. A connection lost mid-batch loses what followed the last message RabbitMQ took (a
connection is one ordered stream), and the next run publishes the batch again from its first row: the
first delivery of each event still comes in id order. The one difference is a nack: RabbitMQ may refuse a
message for one queue (a queue full with ``x-overflow: reject-publish``, a quorum queue without a
majority) and take the ones after it in the batch, which were sent before the nack came back; that queue
then holds them before the refused one, which comes with the batch's second publish (one confirm at a time
stopped at the refused message instead).

:class:`OutboxRelay` is the relay loop's tick: a RabbitMQ outage is logged once (a warning when it
starts, an info when it ends) instead of at every poll, and the events wait in the outbox meanwhile
(``followups_outbox_oldest_unpublished_seconds`` grows: the FollowUpOutboxBacklog alert).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

import msgspec
import pika
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.contracts.events import Event
from libs.common.core.broker import (
    AMQP_TIMEOUT_SECONDS,
    Nodes,
    answer_within,
    close_connection,
    quiet_pika,
)
from libs.common.core.confirms import ConfirmWindow
from libs.common.core.metrics import OUTBOX_OLDEST_UNPUBLISHED, OUTBOX_PUBLISHED
from libs.common.core.outage import Outage
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


#: The outbox's insert as a part of another module's statement (:func:`libs.common.core.sql.with_parts`): the
#: events written in the same execution as the change they record. Its parameters: :func:`events_params`.
EVENTS_PART = QUERIES["insert_events"]


def write_events(
    conn: Connection[Any], project_id: uuid.UUID, events: Sequence[Event], *, occurred_at: datetime
) -> None:
    """Record domain events of one project in the caller's transaction, in the order given.

    The one writer of the outbox: each event is one of the structs of :mod:`libs.common.contracts.events`.
    One statement whatever the count, so under a pipeline it costs no round trip of its own (or none at all:
    :data:`EVENTS_PART` writes them within another statement).
    """
    if not events:
        return
    conn.execute(QUERIES["insert_events"], events_params(project_id, events, occurred_at=occurred_at))


def events_params(project_id: uuid.UUID, events: Sequence[Event], *, occurred_at: datetime) -> dict[str, Any]:
    """The parameters of :data:`EVENTS_PART` (and of :func:`write_events`' statement): ``events`` (none is
    allowed: nothing is written) of one project, in the order given."""
    rows = [
        {"type": e.type, "aggregate_type": e.aggregate_type, "aggregate_id": e.aggregate_id, "data": e}
        for e in events
    ]
    # one JSON document, encoded here: cheaper than adapting four arrays element by element
    return {"project_id": project_id, "events": _encode(rows).decode(), "occurred_at": occurred_at}


def purge_published(conn: Connection[Any], project_id: uuid.UUID, *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` of the project's events published more than 7 days ago; returns how many
    went (the retention job calls it a batch per transaction, project by project)."""
    params = {"project_id": project_id, "now": now, "limit": limit}
    return conn.execute(QUERIES["published_outbox"], params).rowcount


def erase_contact(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID) -> None:
    """Privacy erasure, the outbox's part: the contact's ``message.claimed`` events (the phone and the text
    for the send lane) are deleted, in the caller's transaction."""
    conn.execute(QUERIES["erase_contact"], {"project_id": project_id, "contact_id": contact_id})


class Publisher(Protocol):
    def publish(self, envelopes: list[Envelope]) -> None:
        """Publish every envelope durably, in order, or raise."""
        ...

    def close(self) -> None: ...


class AmqpPublisher:
    """Publishes to a durable RabbitMQ topic exchange with publisher confirms: a batch is published whole,
    then its confirms are waited for together (:class:`~libs.common.core.confirms.ConfirmWindow`), at most
    ``confirm_window`` messages unconfirmed at a time (None: the whole batch; 1: one confirm per message,
    the way it was before, kept for ``make bench-outbox``). :meth:`publish` returns only when every
    message of the batch is confirmed, and raises otherwise (a nack, a lost connection, an answer not
    within ``timeout`` seconds: :func:`~libs.common.core.broker.answer_within`). A connection that fails
    is dropped; the next batch connects to a live node of ``url`` (:class:`Nodes`)."""

    def __init__(
        self,
        url: str,
        exchange: str,
        *,
        timeout: float = AMQP_TIMEOUT_SECONDS,
        confirm_window: int | None = None,
    ) -> None:
        quiet_pika()
        self._nodes = Nodes(url, timeout=timeout)
        self._exchange = exchange
        self._timeout = timeout
        self._window = confirm_window
        self._connection: Any = None
        self._channel: Any = None
        self._confirms: ConfirmWindow | None = None

    def _ensure(self) -> ConfirmWindow:
        if self._confirms is None or not self._channel.is_open:
            self.close()
            self._connection = self._nodes.connect()  # a live node; the exchange declared on each
            with answer_within(self._connection, self._timeout):
                self._channel = self._connection.channel()
                self._channel.exchange_declare(self._exchange, exchange_type="topic", durable=True)
            self._confirms = ConfirmWindow(self._connection, self._channel, timeout=self._timeout)
        return self._confirms

    def publish(self, envelopes: list[Envelope]) -> None:
        try:
            self._ensure().publish_all(
                self._exchange,
                (
                    (
                        envelope.type,
                        _encode(envelope),
                        pika.BasicProperties(
                            content_type="application/json",
                            delivery_mode=pika.DeliveryMode.Persistent,
                            message_id=str(envelope.id),
                            type=envelope.type,
                        ),
                    )
                    for envelope in envelopes
                ),
                window=self._window,
            )
        except Exception:
            self.close()  # unconfirmed messages: a later answer must not count for the next batch
            raise

    def close(self) -> None:
        connection, self._connection, self._channel, self._confirms = self._connection, None, None, None
        close_connection(connection, self._timeout)


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


class PublishFailed(Exception):
    """The publisher did not publish the batch; its events stay in the outbox for the next run."""


def relay_batch(pool: ConnectionPool, publisher: Publisher, *, limit: int = 500) -> int:
    """Publish one batch of unpublished events in id order; returns how many were published (0 when
    another relay holds the lock). Raises :class:`PublishFailed` when the publisher fails."""
    with pool.connection() as conn:
        locked = conn.execute(QUERIES["try_relay_lock"], {"key": RELAY_LOCK_KEY}).fetchone()
        if not locked or not locked[0]:
            _observe_backlog(conn)  # another relay is publishing; this process's gauge stays current
            return 0
        conn.commit()
        try:
            envelopes = _relay_locked(conn, publisher, limit)
        finally:
            _unlock(conn)
    for envelope in envelopes:
        OUTBOX_PUBLISHED.labels(envelope.type).inc()
    return len(envelopes)


def _relay_locked(conn: Connection[Any], publisher: Publisher, limit: int) -> list[Envelope]:
    """Read, publish and mark one batch, holding the relay lock but no transaction while publishing.

    The backlog gauge comes with the read, which takes one row more than the batch: the batch's first row
    is the oldest waiting event while it is published, the row after it the oldest left once it is marked
    (none: nothing waits). No scan of its own, which would step over every row published since the last
    vacuum at each batch."""
    rows = conn.execute(QUERIES["unpublished_events"], {"limit": limit + 1}).fetchall()
    read_at = time.monotonic()
    batch, rest = rows[:limit], rows[limit:]
    OUTBOX_OLDEST_UNPUBLISHED.set(batch[0][-1] if batch else 0.0)
    conn.commit()  # nothing but the session lock is held while RabbitMQ is waited for
    if not batch:
        return []
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
        for _, event_id, type_, project_id, aggregate_type, aggregate_id, data, occurred_at, _ in batch
    ]
    try:
        publisher.publish(envelopes)
    except Exception as exc:
        raise PublishFailed(repr(exc)) from exc
    conn.execute(QUERIES["mark_published"], {"ids": [row[0] for row in batch]})
    conn.commit()
    OUTBOX_OLDEST_UNPUBLISHED.set(rest[0][-1] + time.monotonic() - read_at if rest else 0.0)
    return envelopes


def _observe_backlog(conn: Connection[Any]) -> None:
    oldest = conn.execute(QUERIES["oldest_unpublished_age"]).fetchone()
    OUTBOX_OLDEST_UNPUBLISHED.set(float(oldest[0]) if oldest else 0.0)


def _unlock(conn: Connection[Any]) -> None:
    """Release the relay lock; a connection that cannot is closed (the server drops the lock with the
    session), so the pool never hands out a connection holding it."""
    try:
        conn.rollback()  # a failed mark leaves an aborted transaction
        conn.execute(QUERIES["relay_unlock"], {"key": RELAY_LOCK_KEY})
        conn.commit()
    except Exception:
        log.warning("relay lock not released; closing its connection", exc_info=True)
        conn.close()


class OutboxRelay:
    """The relay loop's tick (:func:`relay_batch`): a RabbitMQ outage is logged once, a warning when it
    starts and an info when a batch is published again, instead of an error at every poll."""

    def __init__(self, pool: ConnectionPool, publisher: Publisher, *, limit: int = 500) -> None:
        self._pool = pool
        self._publisher = publisher
        self._limit = limit
        self.outage = Outage(log, "domain events wait in the outbox")

    def __call__(self) -> int:
        try:
            published = relay_batch(self._pool, self._publisher, limit=self._limit)
        except PublishFailed as exc:
            self.outage.failed(exc.__cause__ or exc)
            return 0
        if published:
            self.outage.succeeded()
        return published
