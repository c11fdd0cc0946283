"""How a process talks to RabbitMQ without ever waiting on it for long.

- :func:`create_broker`: the Dramatiq broker, RabbitMQ from ``AMQP_URL`` in production (the StubBroker
  embedded and in tests). Its :meth:`BoundedRabbitmqBroker.enqueue` is bounded in time: connecting
  (``AMQP_TIMEOUT_SECONDS``, through pika's ``socket_timeout`` and ``stack_timeout``), and then every wait
  on an answer (a publisher confirm, a queue declare: :func:`answer_within`), so a blocked broker (a disk
  or memory alarm) or one that accepts connections and never answers costs a sender that long, once.
- :func:`nudge`: an actor message that only cuts latency (the loops poll PostgreSQL anyway), sent
  fire-and-forget: handed to one sender thread per broker through a bounded queue (:class:`BackgroundSender`),
  so a request thread never waits on RabbitMQ. A nudge that does not fit, or that RabbitMQ does not take,
  is dropped and counted (``followups_broker_messages_dropped_total``): it costs latency, never correctness.
- :class:`Outage`: one warning when RabbitMQ stops answering, one info when it answers again (never one
  line per message), and attempts spaced out in between (1 s doubling to 30 s) so that the callers that
  are not the one trying fail at once instead of each waiting out a timeout. pika's own loggers are
  quieted (:func:`quiet_pika`): an outage would otherwise print dozens of ERROR lines a message.

The outbox relay (:mod:`libs.common.core.outbox`) and the cache invalidation
(:mod:`libs.common.core.invalidation`) open their own connections with :func:`connection_parameters`
and bound their waits with :func:`answer_within` too.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qs, urlsplit

import dramatiq
import pika
import pika.exceptions
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import current_millis, dq_name, q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware
from periodiq import PeriodiqMiddleware

from libs.common.contracts import actors
from libs.common.core.metrics import ACTOR_DURATION, ACTOR_MESSAGES, BROKER_MESSAGES_DROPPED
from libs.common.core.settings import BrokerSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Every service's queue; declared up front so any process may send to any service.
QUEUES = (
    actors.RELEASE_QUEUE,
    actors.TRIGGERS_QUEUE,
    actors.AI_STEPS_QUEUE,
    actors.RETENTION_QUEUE,
    actors.INGRESS_QUEUE,
)

#: Longest wait on RabbitMQ: to connect (TCP and AMQP handshake), and then for each answer (a publisher
#: confirm, a declare). A URL's own ``socket_timeout``, ``stack_timeout``, ``blocked_connection_timeout``
#: or ``connection_attempts`` query parameter wins.
AMQP_TIMEOUT_SECONDS = 5.0

#: Fire-and-forget messages (nudges, cache invalidations) one sender holds while RabbitMQ is slow; more
#: are dropped (``reason="queue_full"``).
SENDER_QUEUE_SIZE = 1000

#: After a failure, the next attempt comes this long later, then twice as long each time, up to
#: :data:`OUTAGE_MAX_RETRY_SECONDS`; the calls in between fail at once.
OUTAGE_FIRST_RETRY_SECONDS = 1.0
OUTAGE_MAX_RETRY_SECONDS = 30.0


class ActorMetrics(Middleware):
    """Counts and times every message an actor processes (Prometheus, safe across processes)."""

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        message.options["_started"] = time.monotonic()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        started = message.options.pop("_started", None)
        if started is not None:
            ACTOR_DURATION.labels(message.actor_name).observe(time.monotonic() - started)
        ACTOR_MESSAGES.labels(message.actor_name, "failed" if exception else "done").inc()

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        ACTOR_MESSAGES.labels(message.actor_name, "skipped").inc()


def _middleware() -> list[Middleware]:
    return [m() for m in dramatiq.middleware.default_middleware] + [ActorMetrics(), PeriodiqMiddleware()]


# --- connections bounded in time --------------------------------------------------------------------------


def quiet_pika() -> None:
    """Keep pika's loggers to CRITICAL: while RabbitMQ is down each failed connection attempt logs half a
    dozen ERROR lines; :class:`Outage` says it once, with the error."""
    logging.getLogger("pika").setLevel(logging.CRITICAL)


def connection_parameters(url: str, *, timeout: float = AMQP_TIMEOUT_SECONDS) -> pika.URLParameters:
    """pika's parameters for ``url``, bounded in time: one connection attempt of at most ``timeout``
    seconds (TCP connect and AMQP handshake), and a connection RabbitMQ blocks (an alarm) dropped after
    ``timeout`` seconds. Query parameters of the URL itself win."""
    parameters = pika.URLParameters(url)
    given = parse_qs(urlsplit(url).query)
    bounds: dict[str, float | int] = {
        "socket_timeout": timeout,
        "stack_timeout": timeout,
        "blocked_connection_timeout": timeout,
        "connection_attempts": 1,
    }
    for name, value in bounds.items():
        if name not in given:
            setattr(parameters, name, value)
    return parameters


class BrokerTimeout(Exception):
    """RabbitMQ did not answer in time (blocked by an alarm, or stalled); the connection was dropped."""


@contextmanager
def answer_within(connection: Any, seconds: float) -> Iterator[None]:
    """Drop ``connection`` (a ``pika.BlockingConnection``) when what runs in the block waits longer than
    ``seconds`` for RabbitMQ: the wait then raises :class:`BrokerTimeout`.

    pika bounds connecting (``stack_timeout``) and a blocked connection RabbitMQ told about
    (``blocked_connection_timeout``), but not a publisher confirm or a declare that never comes: that
    would wait until heartbeats time out, minutes. The timer runs in pika's I/O loop, which a blocking
    call drives while it waits; it uses pika's internals (``_impl``), the only way into that loop."""
    impl = connection._impl

    def abort() -> None:
        impl._terminate_stream(BrokerTimeout(f"RabbitMQ did not answer within {seconds:g} s"))

    timer = impl._adapter_call_later(seconds, abort)
    try:
        yield
    finally:
        with suppress(Exception):  # fired already, or the connection is gone: nothing to cancel
            impl._adapter_remove_timeout(timer)


def close_connection(connection: Any, timeout: float = AMQP_TIMEOUT_SECONDS) -> None:
    """Close a ``pika.BlockingConnection`` if it is open, waiting at most ``timeout`` for RabbitMQ's
    answer; a broken or stalled one is simply dropped."""
    if connection is None or not connection.is_open:
        return
    try:
        with answer_within(connection, timeout):
            connection.close()
    except Exception:  # closing a broken connection: nothing left to do
        log.debug("closing an AMQP connection failed", exc_info=True)


class Outage:
    """Whether RabbitMQ answers one sender (a broker, a publisher, a listener): one warning when it stops,
    one info when it answers again, and in between (:meth:`allow`) one attempt after 1 s, then 2, 4, ...
    up to 30 s, so the other callers fail at once instead of each waiting out a timeout."""

    def __init__(
        self,
        logger: logging.Logger,
        consequence: str,
        *,
        first_retry: float = OUTAGE_FIRST_RETRY_SECONDS,
        max_retry: float = OUTAGE_MAX_RETRY_SECONDS,
    ) -> None:
        #: What the outage means, for the warning: "nudges are dropped", "events wait in the outbox".
        self.consequence = consequence
        self._log = logger
        self._first_retry = first_retry
        self._max_retry = max_retry
        self._lock = threading.Lock()
        self._since: float | None = None
        self._retry = first_retry
        self._next_attempt = 0.0

    @property
    def down(self) -> bool:
        return self._since is not None

    def allow(self) -> bool:
        """Whether to try RabbitMQ now: always while it answers; during an outage, once per retry delay
        (the caller that gets True makes the attempt, and reports it with :meth:`failed` or
        :meth:`succeeded`)."""
        with self._lock:
            now = time.monotonic()
            if self._since is None or now >= self._next_attempt:
                if self._since is not None:
                    self._next_attempt = now + self._retry  # one attempt at a time
                return True
            return False

    def failed(self, error: BaseException) -> None:
        with self._lock:
            now = time.monotonic()
            if self._since is None:
                self._since = now
                self._retry = self._first_retry
                self._log.warning(
                    "RabbitMQ unreachable: %s until it answers",
                    self.consequence,
                    extra={"error": repr(error)},
                )
            else:
                self._retry = min(self._retry * 2, self._max_retry)
                self._log.debug("RabbitMQ still unreachable", extra={"error": repr(error)})
            self._next_attempt = now + self._retry

    def succeeded(self) -> None:
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._since is None:
                return
            seconds = time.monotonic() - self._since
            self._since = None
            self._log.info(
                "RabbitMQ answers again",
                extra={"after": self.consequence, "outage_seconds": round(seconds, 3)},
            )


class BrokerUnavailable(ConnectionClosed):
    """RabbitMQ is unreachable; the message was not sent (the next attempt comes after the retry delay).
    A ``ConnectionClosed``, what Dramatiq's own broker raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)  # type: ignore[no-untyped-call]


# --- fire and forget --------------------------------------------------------------------------------------


class BackgroundSender(Generic[T]):
    """Hands items to ``send`` in a daemon thread of its own, through a bounded queue: :meth:`submit`
    never blocks. An item that does not fit, or whose ``send`` raises, is dropped and counted in
    ``followups_broker_messages_dropped_total{kind,reason}`` (``queue_full``, ``broker_unavailable``);
    ``send`` is expected to be bounded in time and to report outages itself (:class:`Outage`).

    The thread starts with the first item, and :meth:`stop` ends it."""

    def __init__(self, kind: str, send: Callable[[T], None], *, maxsize: int = SENDER_QUEUE_SIZE) -> None:
        #: The ``kind`` label of the drop counter: ``nudge``, ``invalidation``.
        self.kind = kind
        self._send = send
        self._queue: queue.Queue[T] = queue.Queue(maxsize)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def submit(self, item: T) -> bool:
        """Queue ``item`` for the sender thread; False (and counted) when it was dropped."""
        if self._stopping.is_set():
            return False
        if self._thread is None:
            self._start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            BROKER_MESSAGES_DROPPED.labels(self.kind, "queue_full").inc()
            return False
        return True

    @property
    def pending(self) -> int:
        """Items queued or being sent (tests wait for 0)."""
        return self._queue.unfinished_tasks

    def stop(self, timeout: float = 2 * AMQP_TIMEOUT_SECONDS) -> None:
        """Stop the thread (what is still queued is dropped, uncounted: the process is stopping)."""
        self._stopping.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=f"broker-sender-{self.kind}", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._send(item)
            except Exception as exc:
                BROKER_MESSAGES_DROPPED.labels(self.kind, "broker_unavailable").inc()
                log.debug("message dropped", extra={"kind": self.kind, "error": repr(exc)})
            finally:
                self._queue.task_done()


# --- the Dramatiq broker ----------------------------------------------------------------------------------


class BoundedRabbitmqBroker(RabbitmqBroker):
    """Dramatiq's RabbitMQ broker (publisher confirms), never waiting on RabbitMQ for long.

    :meth:`enqueue` connects within ``timeout`` seconds and then waits at most ``timeout`` seconds for
    the declare and the confirm (:func:`answer_within`); a connection that turns out stale (RabbitMQ
    restarted since it was last used) is replaced once. During an outage (:class:`Outage`) it raises
    :class:`BrokerUnavailable` at once, but for one attempt per retry delay. :attr:`nudges` sends
    fire-and-forget messages from a thread of its own (:func:`nudge`)."""

    def __init__(
        self, url: str, *, timeout: float = AMQP_TIMEOUT_SECONDS, middleware: list[Middleware]
    ) -> None:
        super().__init__(url=url, confirm_delivery=True, middleware=middleware)
        urls = url.split(";")
        bounded = [connection_parameters(u, timeout=timeout) for u in urls]
        self.parameters = bounded if len(bounded) > 1 else bounded[0]
        self.timeout = timeout
        self.outage = Outage(log, "actor messages are not sent (nudges dropped; the loops poll meanwhile)")
        self.nudges: BackgroundSender[tuple[actors.Contract[Any], actors.Payload]] = BackgroundSender(
            "nudge", lambda item: actors.send(self, item[0], item[1])
        )

    def enqueue(self, message: dramatiq.Message[Any], *, delay: int | None = None) -> dramatiq.Message[Any]:
        if not self.outage.allow():
            raise BrokerUnavailable("RabbitMQ is unreachable; the next attempt comes after the retry delay")
        try:
            sent = self._enqueue(message, delay)
        except Exception as exc:
            self.outage.failed(exc)
            raise BrokerUnavailable(repr(exc)) from exc
        self.outage.succeeded()
        return sent

    def _enqueue(self, message: dramatiq.Message[Any], delay: int | None) -> dramatiq.Message[Any]:
        """Dramatiq's ``RabbitmqBroker.enqueue``, with its waits bounded and one retry instead of five."""
        canonical_queue_name = message.queue_name
        queue_name = canonical_queue_name
        if delay is not None:
            queue_name = dq_name(queue_name)
            message = message.copy(queue_name=queue_name, options={"eta": current_millis() + delay})
        for attempt in (1, 2):
            fresh = getattr(self.state, "connection", None) is None
            connection = self.connection  # connecting is bounded by stack_timeout
            try:
                with answer_within(connection, self.timeout):
                    self.declare_queue(canonical_queue_name, ensure=True)
                    self.emit_before("enqueue", message, delay)
                    self.channel.basic_publish(
                        exchange="",
                        routing_key=queue_name,
                        body=message.encode(),
                        properties=pika.BasicProperties(
                            delivery_mode=2, priority=message.options.get("broker_priority")
                        ),
                        mandatory=True,
                    )
                    self.emit_after("enqueue", message, delay)
                return message
            except Exception as exc:
                del self.connection  # the next attempt (or the next caller) connects anew
                if isinstance(exc, pika.exceptions.UnroutableError):
                    self.queues_pending.add(q_name(queue_name))
                # a stale connection fails at once; a fresh one failing, or a timeout, is an outage
                if attempt == 2 or fresh or isinstance(exc, BrokerTimeout):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self.nudges.stop()
        super().close()


def create_broker(
    settings: BrokerSettings, *, embedded: bool = False, timeout: float = AMQP_TIMEOUT_SECONDS
) -> dramatiq.Broker:
    """The broker for this process, with every service queue declared (``timeout``: see
    :data:`AMQP_TIMEOUT_SECONDS`)."""
    broker: dramatiq.Broker
    if embedded:
        broker = StubBroker(middleware=_middleware())
    else:
        if not settings.amqp_url:
            raise ValueError("AMQP_URL is required outside the embedded mode")
        quiet_pika()
        broker = BoundedRabbitmqBroker(settings.amqp_url, timeout=timeout, middleware=_middleware())
    for queue_name in QUEUES:
        broker.declare_queue(queue_name)
    dramatiq.set_broker(broker)
    return broker


def nudge(broker: dramatiq.Broker, contract: actors.Contract[actors.P], payload: actors.P) -> None:
    """Send an actor message that only cuts latency, without waiting on RabbitMQ: queued for the
    broker's sender thread, or dropped and counted (see the module docstring). Never raises. The
    StubBroker (embedded, tests) takes it at once, in memory."""
    if isinstance(broker, BoundedRabbitmqBroker):
        broker.nudges.submit((contract, payload))
        return
    try:
        actors.send(broker, contract, payload)
    except Exception:  # an in-memory broker does not fail; should one, a nudge is not worth an error
        BROKER_MESSAGES_DROPPED.labels("nudge", "broker_unavailable").inc()
        log.warning("nudge not sent", extra={"actor": contract.actor}, exc_info=True)
