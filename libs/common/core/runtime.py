"""What a running process shares: settings, the pool, the broker, the clock, and its services' parts."""

from __future__ import annotations

from dataclasses import dataclass, field

import dramatiq
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.invalidation import Invalidator
from libs.common.core.loops import PollingLoop
from libs.common.core.settings import Settings


@dataclass
class Runtime:
    """Built once by the composition root and handed to every service it runs."""

    settings: Settings
    pool: ConnectionPool
    broker: dramatiq.Broker
    clock: Clock
    #: Cache invalidation across processes (local only without AMQP_URL).
    invalidator: Invalidator = field(default_factory=Invalidator)


@dataclass
class Service:
    """One service's running parts: the queue its actors listen on and its polling loops."""

    name: str
    queue: str
    loops: list[PollingLoop] = field(default_factory=list)

    def loop(self, name: str) -> PollingLoop:
        return next(loop for loop in self.loops if loop.name == name)
