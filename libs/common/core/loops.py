"""Polling loops: how workers make progress without depending on the broker.

A loop calls its ``tick`` (which returns how much work it did) over and over while there is work;
when idle it sleeps, starting at the poll interval and doubling up to the idle maximum. A broker nudge
calls :meth:`PollingLoop.wake` to cut the sleep short. RabbitMQ down means slower, not stopped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class PollingLoop:
    """Runs ``tick`` in a thread of its own until stopped."""

    def __init__(
        self,
        name: str,
        tick: Callable[[], int],
        *,
        poll_interval: float,
        idle_max_sleep: float,
    ) -> None:
        self.name = name
        self._tick = tick
        self._poll_interval = poll_interval
        self._idle_max_sleep = idle_max_sleep
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Run the next tick now (a nudge)."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        sleep = self._poll_interval
        while not self._stop.is_set():
            self._wake.clear()
            try:
                done = self._tick()
            except Exception:
                log.exception("loop tick failed", extra={"loop": self.name})
                done = 0
            if done:
                sleep = self._poll_interval
                continue
            self._wake.wait(sleep)
            sleep = min(sleep * 2, self._idle_max_sleep)
