"""The API never waits on RabbitMQ: with a broker that accepts connections and never answers (a blackhole
``AMQP_URL``) and with one that stops answering mid-connection (a blocked publisher: a RabbitMQ alarm),
enrolls answer as fast as ever, nothing is lost, the outage is logged once, and once RabbitMQ answers
again the nudges flow and the outbox relays every event.

"Never waits" is asserted exactly: no request thread ever calls the broker's enqueue, only the sender
thread does. Latencies are printed (``-s``) and asserted only against the broker timeout (a request that
waited would take at least that long): enroll p99 is ~7 ms on a quiet machine, but under the parallel
suite on two CPUs a busy PostgreSQL alone pushes it past 50 ms, so the target is measured, not asserted
(performance is measured by benchmarks, never by timed assertions in tests).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.contracts import actors
from libs.common.core import broker as broker_module
from libs.common.core.broker import BackgroundSender, BoundedRabbitmqBroker, create_broker
from libs.common.core.clock import ManualClock
from libs.common.core.invalidation import Invalidator, on_invalidation
from libs.common.core.outbox import AmqpPublisher, OutboxRelay
from libs.common.core.runtime import Runtime
from libs.common.core.settings import BrokerSettings, Settings
from services.release.release import release_batch
from tests.conftest import SHARED_QUEUE_TYPE, Project, client_of
from tests.factories import make_contact, make_sequence
from tests.helpers import EventsConsumer, rows, wait_until
from tests.tcp_proxy import TcpProxy, blackhole

#: Enrolls per measurement.
ENROLLS = 50

#: Every wait on RabbitMQ in these tests (production: AMQP_TIMEOUT_SECONDS); short, so an outage is
#: detected within the test's few seconds. An enroll that waited on RabbitMQ would take at least this.
TIMEOUT = 0.5


def url_via(port: int, amqp_url: str) -> str:
    """``amqp_url`` pointed at 127.0.0.1:``port`` (a proxy or a blackhole)."""
    parts = urlsplit(amqp_url)
    return parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{port}").geturl()


def dropped(kind: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "followups_broker_messages_dropped_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100, method="inclusive")[98]


class Api:
    """The API app over a runtime whose broker is RabbitMQ at ``url``; records which threads publish."""

    def __init__(self, app: Litestar, runtime: Runtime, url: str) -> None:
        broker = create_broker(BrokerSettings(amqp_url=url, queue_type=SHARED_QUEUE_TYPE), timeout=TIMEOUT)
        assert isinstance(broker, BoundedRabbitmqBroker)
        self.broker = broker
        self.runtime = Runtime(runtime.settings, runtime.pool, broker, runtime.clock)
        self.app = app
        #: Names of the threads that called the broker's enqueue (only its sender thread may).
        self.publishing_threads: set[str] = set()
        enqueue = broker.enqueue

        def recording(message: Any, *, delay: int | None = None) -> Any:
            self.publishing_threads.add(threading.current_thread().name)
            return enqueue(message, delay=delay)

        broker.enqueue = recording  # type: ignore[method-assign]

    @contextmanager
    def client(self, project: Project) -> Iterator[TestClient[Any]]:
        """A client of the API, authenticated as ``project``."""
        with client_of(self.app, self.runtime) as client:
            client.headers.update(project.headers)
            yield client

    @property
    def sent_nudges(self) -> bool:
        """Every nudge handed over has been sent or dropped."""
        return self.broker.nudges.pending == 0

    def close(self) -> None:
        self.broker.close()


@pytest.fixture
def sequence(pool: ConnectionPool, project: Project) -> uuid.UUID:
    """A published sequence of one immediate message: each enroll makes an enrollment due now (a nudge)."""
    return make_sequence(pool, project.id)


def enroll_many(
    client: TestClient[Any], pool: ConnectionPool, project: Project, sequence: uuid.UUID
) -> list[float]:
    """``ENROLLS`` enrolls through the API; each one's latency in seconds."""
    contacts = [make_contact(pool, project.id) for _ in range(ENROLLS)]
    latencies = []
    for contact in contacts:
        started = time.perf_counter()
        response = client.post(
            "/v1/enrollments", json={"sequence_id": str(sequence), "contact_id": str(contact)}
        )
        latencies.append(time.perf_counter() - started)
        assert response.status_code == 201, response.text
    return latencies


def report(what: str, latencies: list[float]) -> str:
    summary = (
        f"{what}: enroll p50 {statistics.median(latencies) * 1000:.1f} ms,"
        f" p99 {p99(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms over {len(latencies)}"
    )
    print(f"\n{summary}")
    return summary


def warnings_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING]


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.fixture
def open_api(api_app: Litestar, runtime: Runtime) -> Iterator[Callable[[str], Api]]:
    """Opens an :class:`Api` over RabbitMQ at a URL; each is closed after the test."""
    opened: list[Api] = []

    def open_(url: str) -> Api:
        opened.append(Api(api_app, runtime, url))
        return opened[-1]

    yield open_
    for api in opened:
        api.close()


def test_a_broker_that_never_answers_costs_enrolls_nothing(
    open_api: Callable[[str], Api],
    pool: ConnectionPool,
    project: Project,
    sequence: uuid.UUID,
    clock: ManualClock,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    dropped_before = dropped("nudge", "broker_unavailable") + dropped("nudge", "queue_full")
    with blackhole() as port:
        # Given an API whose AMQP_URL accepts connections and never answers
        api = open_api(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
        with api.client(project) as client:
            # When 50 contacts are enrolled, each due now (each nudges the release workers)
            latencies = enroll_many(client, pool, project, sequence)
            wait_until(lambda: api.sent_nudges, timeout=10, what="every nudge sent or dropped")
    summary = report("blackhole AMQP_URL", latencies)
    # Then no enroll waited on RabbitMQ: only the sender thread ever published
    assert api.publishing_threads == {"broker-sender-nudge"}
    assert p99(latencies) < TIMEOUT, summary
    # every nudge was dropped and counted, the outage logged once, and pika printed nothing
    dropped_after = dropped("nudge", "broker_unavailable") + dropped("nudge", "queue_full")
    assert dropped_after - dropped_before == ENROLLS
    assert [r.getMessage() for r in warnings_of(caplog, "libs.common.core.broker")] == [
        "RabbitMQ unreachable: actor messages are not sent (nudges dropped; the loops poll meanwhile)"
        " until it answers"
    ]
    assert errors(caplog) == []
    # and nothing is lost: the release loop (which polls) releases every enrollment
    assert rows(pool, "SELECT count(*) FROM followup_enrollments WHERE status = 'active'") == [(ENROLLS,)]
    while release_batch(pool, clock, settings.followup):
        pass
    assert rows(pool, "SELECT count(*) FROM messages WHERE source = 'followup'") == [(ENROLLS,)]


@pytest.mark.rabbitmq
def test_a_blocked_broker_costs_enrolls_nothing_and_everything_flows_when_it_answers_again(
    open_api: Callable[[str], Api],
    pool: ConnectionPool,
    project: Project,
    sequence: uuid.UUID,
    clock: ManualClock,
    settings: Settings,
    amqp_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    target = urlsplit(amqp_url)
    exchange = f"followups.events.test.{uuid.uuid4().hex[:8]}"
    consumer = EventsConsumer(amqp_url, exchange, ("followup.#", "message.#"))
    with TcpProxy((target.hostname or "127.0.0.1", target.port or 5672)) as proxy:
        proxied = url_via(proxy.port, amqp_url)
        publisher = AmqpPublisher(proxied, exchange, timeout=TIMEOUT)
        relay = OutboxRelay(pool, publisher)
        api = open_api(proxied)
        try:
            with api.client(project) as client:
                # Given an API whose sender is connected and nudging (RabbitMQ answers)
                broker_module.nudge(
                    api.broker, actors.TRIGGERS_NUDGE, actors.TriggersNudge(project_id=project.id)
                )
                wait_until(lambda: api.sent_nudges, what="the first nudge sent")
                assert not api.broker.outage.down
                # When RabbitMQ blocks its publishers: connections stay open, nothing is answered
                proxy.stall()
                latencies = enroll_many(client, pool, project, sequence)
                wait_until(lambda: api.broker.outage.down, timeout=5, what="the outage noticed")
                # and the release loop queues every step meanwhile; the relay cannot publish the events
                while release_batch(pool, clock, settings.followup):
                    pass
                assert relay() == 0
                assert relay() == 0
                unpublished = rows(pool, "SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0]
                assert unpublished >= 2 * ENROLLS
                # Then RabbitMQ answers again: nudges are sent again, and the outbox relays every event
                proxy.resume()

                def nudged_again() -> bool:
                    broker_module.nudge(
                        api.broker, actors.TRIGGERS_NUDGE, actors.TriggersNudge(project_id=project.id)
                    )
                    wait_until(lambda: api.sent_nudges, what="the nudge sent or dropped")
                    return not api.broker.outage.down

                wait_until(nudged_again, timeout=20, interval=0.2, what="nudges sent again")
                wait_until(lambda: relay() == 0 and not relay.outage.down, timeout=30, what="relayed")
        finally:
            publisher.close()
    try:
        expected = {str(row[0]) for row in rows(pool, "SELECT event_id FROM outbox")}
        seen: set[str] = set()

        def all_seen(key: str, envelope: dict[str, Any]) -> bool:
            seen.add(envelope["id"])
            return seen >= expected

        consumer.wait_for(all_seen, timeout=15)
    finally:
        consumer.close()
    summary = report("blocked (stalled) broker", latencies)
    assert api.publishing_threads == {"broker-sender-nudge"}
    assert p99(latencies) < TIMEOUT, summary
    assert rows(pool, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [(0,)]
    assert rows(pool, "SELECT count(*) FROM messages WHERE source = 'followup'") == [(ENROLLS,)]
    # one warning per outage and per sender (the nudges, the relay), one info when it ends; no errors
    for logger in ("libs.common.core.broker", "libs.common.core.outbox"):
        assert len(warnings_of(caplog, logger)) == 1, [r.getMessage() for r in caplog.records]
        recovered = [
            r for r in caplog.records if r.name == logger and r.getMessage() == "RabbitMQ answers again"
        ]
        assert len(recovered) == 1
    assert errors(caplog) == []


def test_a_cache_invalidation_never_waits_on_rabbitmq(caplog: pytest.LogCaptureFixture) -> None:
    """Published from request threads (a rule changed through the API): handed to a sender thread."""
    caplog.set_level(logging.INFO)
    kind = f"test-{uuid.uuid4().hex[:8]}"
    told: list[uuid.UUID] = []
    on_invalidation(kind, told.append)
    before = dropped("invalidation", "broker_unavailable")
    with blackhole() as port:
        invalidator = Invalidator(f"amqp://guest:guest@127.0.0.1:{port}/%2F", timeout=TIMEOUT)
        try:
            latencies = []
            for _ in range(20):
                started = time.perf_counter()
                invalidator.publish(kind, uuid.uuid4())
                latencies.append(time.perf_counter() - started)
            wait_until(lambda: invalidator.pending == 0, timeout=10, what="every invalidation dropped")
        finally:
            invalidator.stop()
    assert len(told) == 20  # this process's caches forgot at once
    assert max(latencies) < TIMEOUT
    assert dropped("invalidation", "broker_unavailable") - before == 20
    assert len(warnings_of(caplog, "libs.common.core.invalidation")) == 1
    assert errors(caplog) == []


def test_a_full_sender_drops_and_counts_instead_of_waiting() -> None:
    """RabbitMQ slow (each send blocks): the queue fills, and what does not fit is dropped at once."""
    sending, release = threading.Event(), threading.Event()

    def slow_send(item: int) -> None:
        sending.set()
        release.wait(10)

    sender = BackgroundSender("nudge", slow_send, maxsize=2)
    before = dropped("nudge", "queue_full")
    try:
        assert sender.submit(0)
        assert sending.wait(5)  # the sender thread holds item 0
        assert [sender.submit(i) for i in (1, 2, 3, 4)] == [True, True, False, False]
        assert dropped("nudge", "queue_full") - before == 2
        release.set()
        wait_until(lambda: sender.pending == 0, what="the queued items sent")
    finally:
        release.set()
        sender.stop()
