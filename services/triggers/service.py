"""Wiring of the triggers service. Rule matching and the delayed-rule sweep arrive with the rules work."""

from __future__ import annotations

from libs.common.contracts import actors
from libs.common.core.runtime import Runtime, Service


def build(runtime: Runtime) -> Service:
    return Service("triggers", actors.TRIGGERS_QUEUE)
