"""On a 3-node RabbitMQ cluster of the test's own (benchmarks/rabbitmq_cluster.py): every queue the product
declares is a quorum queue with a delivery limit, a message that keeps coming back is dead-lettered, and
when the node every connection is on dies (kill -9), the publisher, the consumers, the outbox relay's
publisher and the cache invalidation move to a live node within seconds, re-declaring what they need, and
say so in one warning and one info each.

Skipped locally when rabbitmq-server is not installed; a failure when ``CI`` is set.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import dramatiq
import pika
import pytest
from dramatiq.common import dq_name, xq_name
from dramatiq.errors import ConnectionClosed

from benchmarks.rabbitmq_cluster import RabbitCluster, rabbitmq_server
from libs.common.contracts import actors
from libs.common.core.broker import (
    DELIVERY_LIMIT,
    QUEUES,
    BoundedRabbitmqBroker,
    _middleware,
    create_broker,
)
from libs.common.core.invalidation import Invalidator, on_invalidation
from libs.common.core.outbox import AmqpPublisher, Envelope
from libs.common.core.settings import BrokerSettings
from tests.helpers import EventsConsumer, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Every wait on RabbitMQ in these tests (production: 5 s).
TIMEOUT = 2.0
#: "Within seconds": Dramatiq's consumer waits 3 s before it reconnects, a quorum queue elects a leader
#: in a few more; generous for a loaded machine.
HEAL = 60
EXCHANGE = "followups.events"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    if rabbitmq_server() is None:
        if os.environ.get("CI"):
            pytest.fail("rabbitmq-server is not installed and CI is set")
        pytest.skip("rabbitmq-server is not installed")
    started = RabbitCluster(Path(tmp_path_factory.mktemp("rabbitmq")), size=3)
    try:
        started.start()
        yield started
    finally:
        started.close()


def live(cluster: RabbitCluster) -> int:
    return next(i for i, process in enumerate(cluster.processes) if process is not None)


def quorum_broker(cluster: RabbitCluster) -> BoundedRabbitmqBroker:
    broker = create_broker(BrokerSettings(amqp_url=cluster.amqp_url), timeout=TIMEOUT)
    assert isinstance(broker, BoundedRabbitmqBroker) and broker.queue_type == "quorum"
    return broker


def test_every_queue_is_a_quorum_queue_with_a_delivery_limit(cluster: RabbitCluster) -> None:
    broker = quorum_broker(cluster)
    try:
        for queue in QUEUES:
            broker.declare_queue(queue, ensure=True)
    finally:
        broker.close()
    declared = cluster.queues(live(cluster))
    for queue in QUEUES:
        for name in (queue, dq_name(queue)):
            assert declared[name]["type"] == "quorum", declared[name]
            arguments = declared[name]["arguments"]
            assert isinstance(arguments, dict)
            assert arguments["x-delivery-limit"] == DELIVERY_LIMIT
            assert arguments["x-dead-letter-routing-key"] == xq_name(queue)
        dead = declared[xq_name(queue)]
        assert dead["type"] == "quorum"
        assert isinstance(dead["arguments"], dict) and "x-message-ttl" in dead["arguments"]


def test_a_message_that_keeps_coming_back_is_dead_lettered(cluster: RabbitCluster) -> None:
    # Given a message on a service queue (a worker that dies holding it gives it back each time)
    broker = quorum_broker(cluster)
    try:
        actors.send(broker, actors.TRIGGERS_NUDGE, actors.TriggersNudge(project_id=uuid.uuid4()))
    finally:
        broker.close()
    connection = pika.BlockingConnection(pika.URLParameters(cluster.urls[live(cluster)]))
    channel = connection.channel()
    deliveries = 0

    def given_back_until_dead_lettered() -> bool:
        nonlocal deliveries
        method, _, _ = channel.basic_get(actors.TRIGGERS_QUEUE)
        if method is not None:
            deliveries += 1
            channel.basic_nack(method.delivery_tag, requeue=True)
        return cluster.queues(live(cluster))[xq_name(actors.TRIGGERS_QUEUE)]["messages"] == 1

    try:
        # When it is given back again and again
        wait_until(given_back_until_dead_lettered, timeout=HEAL, interval=0.05, what="dead-lettered")
        # Then after the delivery limit it is in the dead-letter queue, no longer on the service queue
        assert DELIVERY_LIMIT <= deliveries <= DELIVERY_LIMIT + 1
        assert channel.basic_get(actors.TRIGGERS_QUEUE)[0] is None
    finally:
        connection.close()


def test_a_queue_of_another_type_is_named_in_one_error(
    cluster: RabbitCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a queue an older deployment declared classic
    connection = pika.BlockingConnection(pika.URLParameters(cluster.urls[live(cluster)]))
    connection.channel().queue_declare("followups.legacy", durable=True)
    connection.close()
    broker = BoundedRabbitmqBroker(cluster.amqp_url, timeout=TIMEOUT, middleware=_middleware())
    try:
        # When a process with quorum queues declares it
        with (
            caplog.at_level(logging.ERROR, logger="libs.common.core.broker"),
            pytest.raises(ConnectionClosed),
        ):
            broker.declare_queue("followups.legacy", ensure=True)
    finally:
        broker.close()
    # Then it fails, and the log says why, once, naming the setting
    errors = [r for r in caplog.records if r.name == "libs.common.core.broker"]
    assert len(errors) == 1
    assert "AMQP_QUEUE_TYPE=quorum" in errors[0].getMessage()
    assert errors[0].__dict__["queue"] == "followups.legacy"


def _retrying(action: Callable[[], object]) -> Callable[[], bool]:
    """``action`` as a ``wait_until`` predicate: True once it did not raise."""

    def attempt() -> bool:
        try:
            action()
        except Exception:
            return False
        return True

    return attempt


def _envelope() -> Envelope:
    return Envelope(
        id=uuid.uuid4(),
        type="cluster.probe",
        source="followups",
        time=datetime.now(UTC),
        project_id=uuid.uuid4(),
        subject="probe/1",
        data={},
    )


def test_everything_moves_to_a_live_node_when_its_node_dies(
    cluster: RabbitCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # Given a worker consuming a service queue, a relay's publisher, and two processes' cache
    # invalidation, all connected to the first node
    broker = quorum_broker(cluster)
    received: list[int] = []

    @dramatiq.actor(broker=broker, actor_name="cluster_probe", queue_name=actors.RELEASE_QUEUE, max_retries=0)
    def probe(number: int) -> None:
        received.append(number)

    worker = dramatiq.Worker(broker, queues={actors.RELEASE_QUEUE}, worker_threads=1, worker_timeout=100)
    publisher = AmqpPublisher(cluster.amqp_url, EXCHANGE, timeout=TIMEOUT)
    events = EventsConsumer(cluster.urls[2], EXCHANGE, ("cluster.#",))  # on a node that stays
    sender = Invalidator(cluster.amqp_url, timeout=TIMEOUT)
    listener = Invalidator(cluster.amqp_url, timeout=TIMEOUT, reconnect_seconds=0.2)
    heard: list[uuid.UUID] = []

    def forget(project_id: uuid.UUID) -> None:
        if threading.current_thread().name == "cache-invalidation":  # the listener's, not the local call
            heard.append(project_id)

    on_invalidation("cluster-probe", forget)
    worker.start()
    listener.start()
    try:
        assert listener.wait_ready(HEAL)
        probe.send(0)
        first = _envelope()
        publisher.publish([first])
        sender.publish("cluster-probe", before := uuid.uuid4())
        wait_until(lambda: received == [0], timeout=HEAL, what="the first message consumed")
        events.wait_for(lambda _, envelope: envelope["id"] == str(first.id))
        wait_until(lambda: before in heard, timeout=HEAL, what="the first invalidation heard")
        assert broker.nodes.ordered()[0].port == cluster.ports[0]
        caplog.clear()

        # When that node dies
        cluster.kill(0)

        # Then messages are sent and consumed again, through the live nodes
        wait_until(_retrying(lambda: probe.send(1)), timeout=HEAL, interval=0.5, what="a message sent")
        wait_until(lambda: 1 in received, timeout=HEAL, what="a message consumed after the node died")
        assert broker.nodes.ordered()[0].port != cluster.ports[0]
        # the relay's publisher publishes again
        after = _envelope()
        wait_until(_retrying(lambda: publisher.publish([after])), timeout=HEAL, interval=0.5, what="relayed")
        events.wait_for(lambda _, envelope: envelope["id"] == str(after.id))
        # and the other process's listener, its own queue declared anew, hears invalidations again
        moved = uuid.uuid4()

        def heard_after_publishing() -> None:
            sender.publish("cluster-probe", moved)
            wait_until(lambda: moved in heard, timeout=1, what="the invalidation heard")

        wait_until(_retrying(heard_after_publishing), timeout=HEAL, interval=0.2, what="invalidation heard")
    finally:
        worker.stop()
        listener.stop()
        sender.stop()
        publisher.close()
        events.close()
        broker.close()

    # And each lost and found its node in one warning and one info, without a critical line
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert not [r for r in records if r.levelno >= logging.CRITICAL], [r.getMessage() for r in records]
    assert not [r for r in records if "Consumer encountered" in r.getMessage()]
    lost = [
        r.getMessage() for r in records if r.levelno == logging.WARNING and "unreachable" in r.getMessage()
    ]
    consumer = (
        "RabbitMQ unreachable: actor messages are not received (the loops poll meanwhile) until it answers"
    )
    assert lost.count(consumer) == 1, lost
    back = [r for r in records if r.getMessage() == "RabbitMQ answers again"]
    assert [r.__dict__["after"] for r in back].count(broker.consumer_outage.consequence) == 1
