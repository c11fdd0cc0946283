"""Invalidation of per-process caches (a project's rules, ...): a change committed by one process reaches
every other within a second over the RabbitMQ fanout exchange ``followup-settings-invalidate``; every cache
also expires by TTL (at most 30 s), which covers RabbitMQ being down.

A cache registers what to forget with :func:`on_invalidation`; the process that made a change calls
:meth:`Invalidator.publish` after its commit: this process's caches forget at once, the others when the
message arrives. Each process runs one listener thread (an exclusive, auto-deleted queue bound to the
exchange), which reconnects after a broken connection. Without ``AMQP_URL`` (the embedded mode: one
process) only the local caches are told.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

import msgspec
import pika
import pika.exceptions

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

    def __init__(self, amqp_url: str | None = None, *, reconnect_seconds: float = 1.0) -> None:
        self.amqp_url = amqp_url
        self.reconnect_seconds = reconnect_seconds
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._publish_lock = threading.Lock()
        self._channel: pika.adapters.blocking_connection.BlockingChannel | None = None

    def publish(self, kind: str, project_id: uuid.UUID) -> None:
        """Tell every process (this one first) that ``kind`` changed for the project. Never raises: a lost
        message only costs the TTL."""
        message = Invalidation(kind=kind, project_id=project_id)
        _dispatch(message)
        if not self.amqp_url:
            return
        body = msgspec.json.encode(message)
        with self._publish_lock:
            for attempt in (1, 2):  # a stale connection is replaced once
                try:
                    if self._channel is None or self._channel.is_closed:
                        connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
                        self._channel = connection.channel()
                        self._channel.exchange_declare(EXCHANGE, exchange_type="fanout", durable=True)
                    self._channel.basic_publish(EXCHANGE, "", body)
                    return
                except pika.exceptions.AMQPError as exc:
                    self._channel = None
                    if attempt == 2:
                        log.warning(
                            "cache invalidation not published; other processes see the change within the TTL",
                            extra={"kind": kind, "project_id": str(project_id), "error": repr(exc)},
                        )

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
        """Stop the listener and close the publishing connection."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        with self._publish_lock:
            if self._channel is not None and self._channel.connection.is_open:
                self._channel.connection.close()
            self._channel = None

    def _listen(self) -> None:
        assert self.amqp_url
        while not self._stopping.is_set():
            try:
                connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
                try:
                    channel = connection.channel()
                    channel.exchange_declare(EXCHANGE, exchange_type="fanout", durable=True)
                    queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
                    channel.queue_bind(queue, EXCHANGE)
                    self._ready.set()
                    log.info("cache invalidation listening", extra={"exchange": EXCHANGE})
                    for method, _, body in channel.consume(queue, auto_ack=True, inactivity_timeout=0.2):
                        if self._stopping.is_set():
                            break
                        if method is not None and body is not None:
                            self._apply(body)
                finally:
                    self._ready.clear()
                    if connection.is_open:
                        connection.close()
            except pika.exceptions.AMQPError as exc:
                log.warning("cache invalidation listener reconnecting", extra={"error": repr(exc)})
                self._stopping.wait(self.reconnect_seconds)

    def _apply(self, body: bytes) -> None:
        try:
            message = msgspec.json.decode(body, type=Invalidation)
        except msgspec.DecodeError:
            log.warning(
                "malformed cache invalidation ignored", extra={"body": body[:200].decode(errors="replace")}
            )
            return
        _dispatch(message)
