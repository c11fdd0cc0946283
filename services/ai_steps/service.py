"""Wiring of the AI steps service. The lease, model call and second pass arrive with the AI work."""

from __future__ import annotations

from libs.common.contracts import actors
from libs.common.core.runtime import Runtime, Service


def build(runtime: Runtime) -> Service:
    return Service("ai_steps", actors.AI_STEPS_QUEUE)
