"""Dramatiq broker setup: RabbitMQ from ``AMQP_URL`` in production, the StubBroker embedded and in tests."""

from __future__ import annotations

import logging
import time
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware
from periodiq import PeriodiqMiddleware

from libs.common.contracts import actors
from libs.common.core.metrics import ACTOR_DURATION, ACTOR_MESSAGES
from libs.common.core.settings import BrokerSettings

log = logging.getLogger(__name__)


#: Every service's queue; declared up front so any process may send to any service.
QUEUES = (
    actors.RELEASE_QUEUE,
    actors.TRIGGERS_QUEUE,
    actors.AI_STEPS_QUEUE,
    actors.RETENTION_QUEUE,
    actors.INGRESS_QUEUE,
)


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


def create_broker(settings: BrokerSettings, *, embedded: bool = False) -> dramatiq.Broker:
    """The broker for this process, with every service queue declared."""
    broker: dramatiq.Broker
    if embedded:
        broker = StubBroker(middleware=_middleware())
    else:
        if not settings.amqp_url:
            raise ValueError("AMQP_URL is required outside the embedded mode")
        broker = RabbitmqBroker(url=settings.amqp_url, confirm_delivery=True, middleware=_middleware())
    for queue in QUEUES:
        broker.declare_queue(queue)
    dramatiq.set_broker(broker)
    return broker
