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
- :class:`~libs.common.core.outage.Outage`: one warning when RabbitMQ stops answering, one info when it
  answers again (never one line per message), and attempts spaced out in between (1 s doubling to 30 s)
  so that the callers that are not the one trying fail at once instead of each waiting out a timeout.
  pika's own loggers are quieted (:func:`quiet_pika`): an outage would otherwise print dozens of ERROR
  lines a message; so is the line Dramatiq's consumer logs every 3 s while it reconnects
  (:class:`ConsumerOutageLog`).
- :class:`Nodes`: ``AMQP_URL`` may list a cluster's nodes (comma-separated); every connection goes to the
  first live one, the node last connected to first.
- :func:`queue_arguments`: every queue is a quorum queue (``AMQP_QUEUE_TYPE=quorum``, the default) with a
  delivery limit (:data:`DELIVERY_LIMIT`), or a classic one (docs/operations.md, "Quorum queues").

The outbox relay (:mod:`libs.common.core.outbox`) and the cache invalidation
(:mod:`libs.common.core.invalidation`) open their own connections through :class:`Nodes` and bound
their waits with :func:`answer_within` too.
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
from dramatiq.broker import Consumer
from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL, RabbitmqBroker, _RabbitmqConsumer
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import current_millis, dq_name, q_name, xq_name
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware
from periodiq import PeriodiqMiddleware

from libs.common.contracts import actors
from libs.common.core.metrics import ACTOR_DURATION, ACTOR_MESSAGES, BROKER_MESSAGES_DROPPED
from libs.common.core.outage import Outage
from libs.common.core.settings import BrokerSettings, node_urls

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

#: ``AMQP_QUEUE_TYPE``: every queue the product declares is a quorum queue (replicated on a majority of the
#: cluster's nodes, and surviving the loss of a minority), or a classic one (a single node's).
QUEUE_TYPES = ("quorum", "classic")

#: A quorum queue's ``x-delivery-limit``: a message delivered this many times without being acknowledged
#: (each time a worker died, or lost its connection, while holding it) goes to the dead-letter queue
#: (``<queue>.XQ``) instead of coming back forever. High enough for a few broker failovers (a message a
#: consumer held when its node died comes back once).
DELIVERY_LIMIT = 10

#: Fire-and-forget messages (nudges, cache invalidations) one sender holds while RabbitMQ is slow; more
#: are dropped (``reason="queue_full"``).
SENDER_QUEUE_SIZE = 1000


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


class Nodes:
    """The RabbitMQ nodes of ``AMQP_URL``, in the order a new connection tries them: the node this process
    last connected to first, then the ones after it in the list (and around). pika tries each in turn,
    one attempt of at most ``timeout`` seconds each (:func:`connection_parameters`), so when a node dies
    the next connection lands on a live one, and the dead node costs one refused (or timed out) attempt,
    not one at every reconnection. Shared by the threads of a process; a race only reorders attempts."""

    def __init__(self, url: str, *, timeout: float = AMQP_TIMEOUT_SECONDS) -> None:
        self.parameters = [connection_parameters(u, timeout=timeout) for u in node_urls(url)]
        if not self.parameters:
            raise ValueError("AMQP_URL names no node")
        self._first = 0

    def ordered(self) -> list[pika.URLParameters]:
        first = self._first
        return self.parameters[first:] + self.parameters[:first]

    def connect(self) -> pika.BlockingConnection:
        """A connection to the first node that takes it (``pika.exceptions.AMQPConnectionError`` when none
        does)."""
        connection = pika.BlockingConnection(self.ordered())
        self.connected(connection)
        return connection

    def connected(self, connection: pika.BlockingConnection) -> None:
        """Remember the node ``connection`` went to: the next connection tries it first."""
        used = connection._impl.params  # pika keeps a copy of the parameters it connected with
        for index, node in enumerate(self.parameters):
            if (node.host, node.port, node.virtual_host) == (used.host, used.port, used.virtual_host):
                self._first = index
                return


def queue_arguments(queue_type: str, *, consumed: bool = True) -> dict[str, Any]:
    """The ``x-`` arguments that make a queue of ``queue_type`` (``AMQP_QUEUE_TYPE``); a ``consumed`` quorum
    queue also gets its :data:`DELIVERY_LIMIT`. A classic queue gets none: the declaration existing
    deployments made."""
    if queue_type != "quorum":
        return {}
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    if consumed:
        arguments["x-delivery-limit"] = DELIVERY_LIMIT
    return arguments


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


class _NodeConsumer(_RabbitmqConsumer):
    """Dramatiq's consumer; the node it connected to is tried first next time (:class:`Nodes`)."""

    def __init__(self, broker: BoundedRabbitmqBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        broker.nodes.connected(self.connection)


class ConsumerOutageLog(logging.Filter):
    """Turns the lines Dramatiq's consumer thread logs at each reconnection attempt (a critical
    ``Consumer encountered a connection error`` and an info ``Restarting consumer``, every 3 s while
    RabbitMQ is away) into an :class:`Outage`'s one warning; the info comes when a consumer connects
    again (:meth:`BoundedRabbitmqBroker.consume`). Every other line of the thread passes."""

    _PREFIXES = ("Consumer encountered a connection error", "Restarting consumer in")

    def __init__(self, outage: Outage) -> None:
        super().__init__()
        self.outage = outage

    @classmethod
    def install(cls, queue_name: str, outage: Outage) -> None:
        """On the logger of ``queue_name``'s consumer thread (once)."""
        logger = logging.getLogger(f"dramatiq.worker.ConsumerThread({queue_name})")
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls(outage))

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(self._PREFIXES[0]):
            error = record.args[0] if isinstance(record.args, tuple) and record.args else message
            self.outage.failed(error if isinstance(error, BaseException) else BrokerUnavailable(str(error)))
            return False
        return not message.startswith(self._PREFIXES[1])


class BoundedRabbitmqBroker(RabbitmqBroker):
    """Dramatiq's RabbitMQ broker (publisher confirms), never waiting on RabbitMQ for long, on any of the
    cluster's nodes, its queues of ``queue_type`` (:func:`queue_arguments`).

    :meth:`enqueue` connects within ``timeout`` seconds and then waits at most ``timeout`` seconds for
    the declare and the confirm (:func:`answer_within`); a connection that turns out stale (RabbitMQ
    restarted since it was last used, or its node died) is replaced once, on a live node (:attr:`nodes`).
    During an outage (:class:`Outage`) it raises :class:`BrokerUnavailable` at once, but for one attempt
    per retry delay. :attr:`nudges` sends fire-and-forget messages from a thread of its own
    (:func:`nudge`). The consumers of a worker reconnect, to a live node, 3 s after they lose theirs
    (Dramatiq's consumer thread), and say so once (:class:`ConsumerOutageLog`)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = AMQP_TIMEOUT_SECONDS,
        middleware: list[Middleware],
        queue_type: str = "quorum",
    ) -> None:
        if queue_type not in QUEUE_TYPES:
            raise ValueError(f"queue_type must be one of {', '.join(QUEUE_TYPES)}")
        self.nodes = Nodes(url, timeout=timeout)
        self.queue_type = queue_type
        super().__init__(url=node_urls(url), confirm_delivery=True, middleware=middleware)
        self.timeout = timeout
        self.outage = Outage(log, "actor messages are not sent (nudges dropped; the loops poll meanwhile)")
        self.consumer_outage = Outage(log, "actor messages are not received (the loops poll meanwhile)")
        self._mismatched: set[str] = set()
        self.nudges: BackgroundSender[tuple[actors.Contract[Any], actors.Payload]] = BackgroundSender(
            "nudge", lambda item: actors.send(self, item[0], item[1])
        )

    # --- connections: to the nodes in turn (Dramatiq's consumers read ``parameters`` too) -----------------

    @property
    def parameters(self) -> list[pika.URLParameters]:
        return self.nodes.ordered()

    @parameters.setter
    def parameters(self, _: Any) -> None:
        """Dramatiq's ``__init__`` sets its own, unbounded, parameters; :attr:`nodes` stands for them."""

    @property
    def connection(self) -> pika.BlockingConnection:
        connection = getattr(self.state, "connection", None)
        if connection is None:
            connection = self.state.connection = self.nodes.connect()
            self.connections.add(connection)
        return connection

    @connection.deleter
    def connection(self) -> None:
        RabbitmqBroker.connection.fdel(self)  # type: ignore[attr-defined]

    @property
    def consumer_class(self) -> type[_RabbitmqConsumer]:
        return _NodeConsumer

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        """Dramatiq's consumer, on the first live node; its thread's reconnection lines go to
        :attr:`consumer_outage` instead (one warning, one info)."""
        ConsumerOutageLog.install(queue_name, self.consumer_outage)
        consumer = super().consume(queue_name, prefetch, timeout)
        self.consumer_outage.succeeded()
        return consumer

    # --- queues of ``queue_type`` ----------------------------------------------------------------------

    def _build_queue_arguments(self, queue_name: str) -> dict[str, Any]:
        arguments: dict[str, Any] = super()._build_queue_arguments(queue_name)  # type: ignore[no-untyped-call]
        return arguments | queue_arguments(self.queue_type)

    def _declare_queue(self, queue_name: str) -> Any:
        return self._declare(queue_name, self._build_queue_arguments(queue_name))

    def _declare_dq_queue(self, queue_name: str) -> Any:
        return self._declare(dq_name(queue_name), self._build_queue_arguments(queue_name))

    def _declare_xq_queue(self, queue_name: str) -> Any:
        # nothing consumes a dead-letter queue: no delivery limit
        arguments = {"x-message-ttl": DEAD_MESSAGE_TTL} | queue_arguments(self.queue_type, consumed=False)
        return self._declare(xq_name(queue_name), arguments)

    def _declare(self, name: str, arguments: dict[str, Any]) -> Any:
        try:
            return self.channel.queue_declare(queue=name, durable=True, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 406 and name not in self._mismatched:  # PRECONDITION_FAILED, said once
                self._mismatched.add(name)
                log.error(
                    "queue exists with other arguments: AMQP_QUEUE_TYPE=%s does not match it (a queue"
                    " cannot change type in place: see docs/operations.md, Quorum queues)",
                    self.queue_type,
                    extra={"queue": name, "error": exc.reply_text},
                )
            raise

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
        broker = BoundedRabbitmqBroker(
            settings.amqp_url, timeout=timeout, middleware=_middleware(), queue_type=settings.queue_type
        )
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
