"""Wiring of the release service: its polling loop and the nudge actor that wakes it."""

from __future__ import annotations

import logging
from typing import Any

import dramatiq

from libs.common.contracts import actors
from libs.common.core.jobs import RoundRobin
from libs.common.core.loops import PollingLoop
from libs.common.core.runtime import Runtime, Service
from libs.common.followups.release_step import Released
from services.release.release import release_batch, seconds_until_next_due

log = logging.getLogger(__name__)

#: Name of the release polling loop.
RELEASE_LOOP = "release"


def build(runtime: Runtime) -> Service:
    settings = runtime.settings
    ai_lease = settings.ai.step_lease

    def leased(released: Released) -> None:
        """An AI step leased: the ai_steps service writes it (lost, the lease expires and it comes back)."""
        assert released.project_id and released.fence is not None and released.step_index is not None
        try:
            actors.send(
                runtime.broker,
                actors.AI_STEP,
                actors.AiStepDue(
                    project_id=released.project_id,
                    enrollment_id=released.enrollment_id,
                    step_index=released.step_index,
                    fence=released.fence,
                ),
            )
        except Exception:
            log.warning(
                "ai step not sent", extra={"enrollment_id": str(released.enrollment_id)}, exc_info=True
            )

    turns = RoundRobin()  # the loop's turns across projects, kept from one batch to the next
    loop = PollingLoop(
        RELEASE_LOOP,
        lambda: release_batch(
            runtime.pool, runtime.clock, settings.followup, ai_lease=ai_lease, on_lease=leased, turns=turns
        ),
        poll_interval=settings.worker.poll_interval_seconds,
        idle_max_sleep=settings.worker.idle_max_sleep_seconds,
        next_due=lambda: seconds_until_next_due(runtime.pool, runtime.clock),
    )

    def release_nudge(payload: dict[str, Any]) -> None:
        actors.RELEASE_NUDGE.decode(payload)
        loop.wake()

    dramatiq.actor(broker=runtime.broker, **actors.actor_options(actors.RELEASE_NUDGE))(release_nudge)
    return Service("release", actors.RELEASE_QUEUE, [loop])
