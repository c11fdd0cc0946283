"""Wiring of the triggers service: the loop that matches triggers to rules and runs their actions, the loop
that delivers webhooks, and the nudge actor that wakes both."""

from __future__ import annotations

import logging
from typing import Any

import dramatiq

from libs.common.contracts import actors
from libs.common.core.loops import PollingLoop
from libs.common.core.runtime import Runtime, Service
from libs.common.rules import webhooks
from libs.common.rules.triggers import process_triggers

log = logging.getLogger(__name__)

#: Names of the triggers service's polling loops.
TRIGGERS_LOOP = "triggers"
WEBHOOKS_LOOP = "webhooks"


def build(runtime: Runtime) -> Service:
    settings = runtime.settings.worker
    deliveries = PollingLoop(
        WEBHOOKS_LOOP,
        lambda: webhooks.deliver_due(runtime.pool, runtime.clock),
        poll_interval=settings.poll_interval_seconds,
        idle_max_sleep=settings.idle_max_sleep_seconds,
    )

    def triggers() -> int:
        processed = process_triggers(runtime.pool, runtime.clock)
        for enrollment_id, project_id in processed.done.enrollments:
            _send(
                runtime,
                actors.RELEASE_NUDGE,
                actors.ReleaseNudge(project_id=project_id, enrollment_id=enrollment_id),
            )
        if processed.done.webhook_delivery_ids:
            deliveries.wake()
        return processed.triggers

    loop = PollingLoop(
        TRIGGERS_LOOP,
        triggers,
        poll_interval=settings.poll_interval_seconds,
        idle_max_sleep=settings.idle_max_sleep_seconds,
    )

    def triggers_nudge(payload: dict[str, Any]) -> None:
        actors.TRIGGERS_NUDGE.decode(payload)
        loop.wake()
        deliveries.wake()

    dramatiq.actor(broker=runtime.broker, **actors.actor_options(actors.TRIGGERS_NUDGE))(triggers_nudge)
    return Service("triggers", actors.TRIGGERS_QUEUE, [loop, deliveries])


def _send(runtime: Runtime, contract: actors.Contract[actors.P], payload: actors.P) -> None:
    """A nudge: lost, it only costs latency (the loops poll)."""
    try:
        actors.send(runtime.broker, contract, payload)
    except Exception:
        log.warning("nudge not sent", extra={"actor": contract.actor}, exc_info=True)
