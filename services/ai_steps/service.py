"""Wiring of the AI steps service: the ``ai_step`` actor hands each leased AI step to a pool of threads
(``AI_CONCURRENCY``), so model latency does not serialise the service; each thread calls the model holding
no lock, then runs the fenced second pass. A message lost (or a process killed mid-call) costs only the
lease: the step is claimed again when it expires, with a new fence, and a late draft is dropped."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dramatiq

from libs.common.ai.client import ModelClient
from libs.common.ai.step import StepDue, run_step
from libs.common.contracts import actors
from libs.common.core.runtime import Runtime, Service

log = logging.getLogger(__name__)


def build(runtime: Runtime) -> Service:
    settings = runtime.settings
    client = ModelClient(settings.ai) if settings.ai.base_url else None
    if client is None:
        log.warning("AI_BASE_URL is not set: AI steps take their fallback (ai_unavailable)")
    calls = ThreadPoolExecutor(max_workers=settings.ai.concurrency, thread_name_prefix="ai-step")

    def work(due: StepDue) -> None:
        try:
            run_step(runtime.pool, runtime.clock, client, settings.followup, due)
        except Exception:  # the lease expires and the step is claimed again
            log.exception("ai step failed", extra={"enrollment_id": str(due.enrollment_id)})

    def ai_step(payload: dict[str, Any]) -> None:
        message = actors.AI_STEP.decode(payload)
        calls.submit(
            work, StepDue(message.project_id, message.enrollment_id, message.step_index, message.fence)
        )

    dramatiq.actor(broker=runtime.broker, **actors.actor_options(actors.AI_STEP))(ai_step)
    return Service("ai_steps", actors.AI_STEPS_QUEUE)
