"""Wiring of the release service: its polling loop and the nudge actor that wakes it."""

from __future__ import annotations

from typing import Any

import dramatiq

from libs.common.contracts import actors
from libs.common.core.loops import PollingLoop
from libs.common.core.runtime import Runtime, Service
from services.release.release import release_batch

#: Name of the release polling loop.
RELEASE_LOOP = "release"


def build(runtime: Runtime) -> Service:
    settings = runtime.settings
    loop = PollingLoop(
        RELEASE_LOOP,
        lambda: release_batch(runtime.pool, runtime.clock, settings.followup),
        poll_interval=settings.worker.poll_interval_seconds,
        idle_max_sleep=settings.worker.idle_max_sleep_seconds,
    )

    def release_nudge(payload: dict[str, Any]) -> None:
        actors.RELEASE_NUDGE.decode(payload)
        loop.wake()

    dramatiq.actor(broker=runtime.broker, **actors.actor_options(actors.RELEASE_NUDGE))(release_nudge)
    return Service("release", actors.RELEASE_QUEUE, [loop])
