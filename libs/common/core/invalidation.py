"""Invalidation of per-process caches (a project's rules, ...): a change committed by one process reaches
every other within a second over the RabbitMQ fanout exchange ``followup-settings-invalidate``; every cache
also expires by TTL (at most 30 s), which covers RabbitMQ being down.

A cache registers what to forget with :func:`on_invalidation`; the process that made a change calls
:meth:`Invalidator.publish` after its commit: this process's caches forget at once, the others when the
message arrives. Each process runs one listener thread (an exclusive, auto-deleted queue bound to the
exchange), which reconnects after a broken connection. Without ``AMQP_URL`` (the embedded mode: one
process) only the local caches are told.

Publishing never waits on RabbitMQ (it is called from request threads): the message is handed to a sender
thread through a bounded queue (:class:`~libs.common.core.broker.BackgroundSender`), and dropped and
counted (``followups_broker_messages_dropped_total{kind="invalidation"}``) when RabbitMQ is slow or
down; every wait is bounded (``AMQP_TIMEOUT_SECONDS``), and an outage is logged once when it starts and
once when it ends, by the sender and by the listener.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from libs.common.core.broker import (
    AMQP_TIMEOUT_SECONDS,
    BackgroundSender,
    BrokerUnavailable,
    Nodes,
    answer_within,
    close_connection,
    quiet_pika,
)
from libs.common.core.outage import Outage

log = logging.getLogger(__name__)

EXCHANGE = "followup-settings-invalidate"


class Invalidation(msgspec.Struct, kw_only=True, frozen=True):
    #: What changed: the name a cache registered under (``rules``).
    kind: str
    project_id: uuid.UUID


_LISTENERS: dict[str, list[Callable[[uuid.UUID], None]]] = {}


def on_invalidation(kind: str, forget: Callable[[uuid.UUID], None]) -> None:
    """Call ``forget(project_id)`` whenever ``kind`` changes for a project, in any process."""
    _LISTENERS.setdefault(kind, []).append(forget)


def _dispatch(message: Invalidation) -> None:
    for forget in _LISTENERS.get(message.kind, []):
        forget(message.project_id)


class Invalidator:
    """Publishes this process's changes and applies the other processes' ones."""

    def __init__(
        self,
        amqp_url: str | None = None,
        *,
        reconnect_seconds: float = 1.0,
        timeout: float = AMQP_TIMEOUT_SECONDS,
    ) -> None:
        self.amqp_url = amqp_url
        self.reconnect_seconds = reconnect_seconds
        self.timeout = timeout
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: Any = None  # a pika BlockingChannel, used by the sender thread only
        self._node_list: Nodes | None = None
        self._sender: BackgroundSender[bytes] = BackgroundSender("invalidation", self._publish_now)
        self._publish_outage = Outage(
            log, "cache invalidations are not sent (other processes' caches expire within their TTL)"
        )
        self._listen_outage = Outage(
            log, "other processes' cache invalidations are not heard (caches expire within their TTL)"
        )
        if amqp_url:
            quiet_pika()

    def publish(self, kind: str, project_id: uuid.UUID) -> None:
        """Tell every process (this one first) that ``kind`` changed for the project. Never raises nor
        waits: a lost message only costs the TTL."""
        message = Invalidation(kind=kind, project_id=project_id)
        _dispatch(message)
        if self.amqp_url:
            self._sender.submit(msgspec.json.encode(message))

    @property
    def pending(self) -> int:
        """Invalidations queued or being published (tests wait for 0)."""
        return self._sender.pending

    def _publish_now(self, body: bytes) -> None:
        """Publish one message, in the sender thread; raises when RabbitMQ does not take it."""
        if not self._publish_outage.allow():
            raise BrokerUnavailable("RabbitMQ is unreachable; the next attempt comes after the retry delay")
        for attempt in (1, 2):  # a stale connection is replaced once
            fresh = self._channel is None or self._channel.is_closed
            try:
                if self._channel is None or self._channel.is_closed:
                    self._close_channel()
                    self._channel = self._open_channel()
                with answer_within(self._channel.connection, self.timeout):
                    self._channel.basic_publish(EXCHANGE, "", body)
            except Exception as exc:
                self._close_channel()
                if attempt == 2 or fresh:
                    self._publish_outage.failed(exc)
                    raise
            else:
                self._publish_outage.succeeded()
                return

    def _open_channel(self) -> Any:
        """A channel on a new connection, the exchange declared."""
        assert self.amqp_url
        connection = self._nodes().connect()
        try:
            with answer_within(connection, self.timeout):
                channel = connection.channel()
                channel.exchange_declare(EXCHANGE, exchange_type="fanout", durable=True)
        except Exception:
            close_connection(connection, self.timeout)
            raise
        return channel

    def _nodes(self) -> Nodes:
        assert self.amqp_url
        if self._node_list is None:
            self._node_list = Nodes(self.amqp_url, timeout=self.timeout)
        return self._node_list

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            close_connection(channel.connection, self.timeout)

    def start(self) -> None:
        """Start the listener thread (nothing without ``AMQP_URL``)."""
        if not self.amqp_url or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._listen, name="cache-invalidation", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float) -> bool:
        """Whether the listener is bound to the exchange (tests wait for it)."""
        return self._ready.wait(timeout)

    def stop(self) -> None:
        """Stop the listener and the sender, and close the publishing connection."""
        self._stopping.set()
        self._sender.stop()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self._close_channel()

    def _listen(self) -> None:
        assert self.amqp_url
        nodes = self._nodes()
        while not self._stopping.is_set():
            try:
                connection = nodes.connect()
                try:
                    with answer_within(connection, self.timeout):
                        channel = connection.channel()
                        channel.exchange_declare(EXCHANGE, exchange_type="fanout", durable=True)
                        # this process's own queue, declared anew on each connection (a live node's):
                        # exclusive to it, so classic (a quorum queue cannot be exclusive), and nothing is
                        # lost with it but invalidations nobody else needs
                        queue = channel.queue_declare(
                            "", exclusive=True, auto_delete=True, arguments={"x-queue-type": "classic"}
                        ).method.queue
                        channel.queue_bind(queue, EXCHANGE)
                    self._ready.set()
                    self._listen_outage.succeeded()
                    log.info("cache invalidation listening", extra={"exchange": EXCHANGE})
                    for method, _, body in channel.consume(queue, auto_ack=True, inactivity_timeout=0.2):
                        if self._stopping.is_set():
                            break
                        if method is not None and body is not None:
                            self._apply(body)
                finally:
                    self._ready.clear()
                    close_connection(connection, self.timeout)
            except Exception as exc:
                self._listen_outage.failed(exc)
                self._stopping.wait(self.reconnect_seconds)

    def _apply(self, body: bytes) -> None:
        try:
            message = msgspec.json.decode(body, type=Invalidation)
        except msgspec.DecodeError:
            log.warning(
                "malformed cache invalidation ignored", extra={"body": body[:200].decode(errors="replace")}
            )
            return
        try:
            _dispatch(message)
        except Exception:  # a cache's own failure, not the listener's: it keeps listening
            log.exception("cache invalidation failed", extra={"kind": message.kind})
