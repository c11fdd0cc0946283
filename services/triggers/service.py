"""Wiring of the triggers service: the loop that matches triggers to rules and runs their actions, the sweep
of delayed rules that fell due (every second), bulk enrollment jobs (a chunk per transaction), the loop
that delivers webhooks (in parallel, fair per project: :class:`libs.common.rules.webhooks.Dispatcher`), and
the nudge actor that wakes them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dramatiq

from libs.common.contracts import actors
from libs.common.core.loops import PollingLoop
from libs.common.core.runtime import Runtime, Service
from libs.common.rules import bulk, webhooks
from libs.common.rules.actions import Done
from libs.common.rules.executions import sweep
from libs.common.rules.triggers import process_triggers

#: Names of the triggers service's polling loops.
TRIGGERS_LOOP = "triggers"
SWEEP_LOOP = "sweep"
BULK_LOOP = "bulk"
WEBHOOKS_LOOP = "webhooks"


def build(runtime: Runtime) -> Service:
    settings = runtime.settings.worker
    rules = runtime.settings.rules
    dispatcher = webhooks.Dispatcher(
        runtime.pool,
        runtime.clock,
        timeout_s=rules.webhook_timeout_seconds,
        concurrency=rules.webhook_concurrency,
        per_project=rules.webhook_project_concurrency,
        wake=lambda: deliveries.wake(),
    )
    deliveries = PollingLoop(
        WEBHOOKS_LOOP,
        dispatcher.tick,
        poll_interval=settings.poll_interval_seconds,
        idle_max_sleep=settings.idle_max_sleep_seconds,
    )

    def after(done: Done) -> None:
        """Once committed, webhooks the rules queued go out (the release service was nudged by each
        item's after-commit effects, :mod:`libs.common.core.effects`)."""
        if done.webhook_delivery_ids:
            deliveries.wake()

    def triggers() -> int:
        processed = process_triggers(runtime.pool, runtime.clock, runtime=runtime)
        after(processed.done)
        return processed.triggers

    stale_after = timedelta(seconds=runtime.settings.rules.execution_stale_after_seconds)

    def delayed() -> int:
        swept = sweep(runtime.pool, runtime.clock, stale_after=stale_after, runtime=runtime)
        after(swept.done)
        return swept.claimed

    bulk_jobs = PollingLoop(
        BULK_LOOP,
        lambda: bulk.process_chunk(runtime.pool, runtime.clock, runtime=runtime),
        poll_interval=settings.poll_interval_seconds,
        idle_max_sleep=settings.idle_max_sleep_seconds,
    )

    interval = runtime.settings.rules.sweep_interval_seconds
    sweeper = PollingLoop(SWEEP_LOOP, delayed, poll_interval=interval, idle_max_sleep=interval)

    loop = PollingLoop(
        TRIGGERS_LOOP,
        triggers,
        poll_interval=settings.poll_interval_seconds,
        idle_max_sleep=settings.idle_max_sleep_seconds,
    )

    def triggers_nudge(payload: dict[str, Any]) -> None:
        actors.TRIGGERS_NUDGE.decode(payload)
        loop.wake()
        sweeper.wake()
        bulk_jobs.wake()
        deliveries.wake()

    dramatiq.actor(broker=runtime.broker, **actors.actor_options(actors.TRIGGERS_NUDGE))(triggers_nudge)
    return Service("triggers", actors.TRIGGERS_QUEUE, [loop, sweeper, bulk_jobs, deliveries])
