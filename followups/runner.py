"""Running services in a process: Dramatiq worker, polling loops, outbox relay, cron, metrics."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import dramatiq
from prometheus_client import start_http_server

from libs.common.core import metrics
from libs.common.core.loops import PollingLoop
from libs.common.core.outbox import OutboxRelay, Publisher
from libs.common.core.runtime import Runtime, Service
from libs.common.core.schedule import CronScheduler
from services.ai_steps.service import build as build_ai_steps
from services.api.ingress import build as build_ingress
from services.release.service import build as build_release
from services.retention.service import build as build_retention
from services.send_lane.service import build as build_send_lane
from services.triggers.service import build as build_triggers

log = logging.getLogger(__name__)

#: Every worker service, by the name `followups worker <name>` takes.
SERVICES: dict[str, Callable[[Runtime], Service]] = {
    "ingress": build_ingress,
    "release": build_release,
    "triggers": build_triggers,
    "ai_steps": build_ai_steps,
    "retention": build_retention,
    "send-lane": build_send_lane,
}

#: Name of the outbox relay loop.
RELAY_LOOP = "outbox-relay"


@dataclass
class Running:
    """Services started in this process; :meth:`stop` shuts them down in reverse order."""

    runtime: Runtime
    services: list[Service]
    worker: dramatiq.Worker
    relay: PollingLoop
    cron: CronScheduler
    _stopped: bool = field(default=False)

    @property
    def loops(self) -> list[PollingLoop]:
        return [loop for service in self.services for loop in service.loops] + [self.relay]

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.cron.stop()
        for loop in self.loops:
            loop.stop()
        self.worker.stop()
        self.runtime.broker.close()
        log.info("services stopped", extra={"services": [s.name for s in self.services]})


def start_services(runtime: Runtime, names: list[str], publisher: Publisher) -> Running:
    """Build and start the named services, the outbox relay and the cron scheduler."""
    services = [SERVICES[name](runtime) for name in names]
    worker_settings = runtime.settings.worker
    relay = PollingLoop(
        RELAY_LOOP,
        OutboxRelay(runtime.pool, publisher),
        poll_interval=worker_settings.poll_interval_seconds,
        idle_max_sleep=worker_settings.idle_max_sleep_seconds,
    )
    worker = dramatiq.Worker(
        runtime.broker, queues={s.queue for s in services}, worker_threads=worker_settings.threads
    )
    worker.start()
    cron = CronScheduler(list(runtime.broker.actors.values()))
    running = Running(runtime, services, worker, relay, cron)
    for loop in running.loops:
        loop.start()
    cron.start()
    log.info("services started", extra={"services": names})
    return running


def serve_metrics(port: int) -> None:
    """Serve this process's Prometheus metrics (all processes' in multiprocess mode) on ``port``."""
    if port:
        registry = metrics.exposition_registry()
        if registry is not None:
            start_http_server(port, registry=registry)
        else:
            start_http_server(port)


def shutdown_requested() -> threading.Event:
    """An event set by SIGINT or SIGTERM (install before starting anything, so no signal is lost)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
