"""Wiring of the triggers service. Rule matching and the delayed-rule sweep arrive with the rules work."""

from __future__ import annotations

from libs.common import contracts
from libs.common.runtime import Runtime, Service


def build(runtime: Runtime) -> Service:
    return Service("triggers", contracts.TRIGGERS_QUEUE)
