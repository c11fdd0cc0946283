"""Polling loops: how workers make progress without depending on the broker.

A loop calls its ``tick`` (which returns how much work it did) over and over while there is work;
when idle it sleeps, starting at the poll interval and doubling up to the idle maximum. A broker nudge
calls :meth:`PollingLoop.wake` to cut the sleep short. RabbitMQ down means slower, not stopped.

How a loop sleeps is a function of its own (``wait``, by default :func:`wait_for_wake`), so a test can
record the sleeps a loop asks for and drive its ticks without waiting for real time to pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How a loop sleeps: ``wait(wake, seconds)`` returns when ``wake`` is set or ``seconds`` have passed, and
#: tells which (True: woken; False: timed out), like :meth:`threading.Event.wait`.
Wait = Callable[[threading.Event, float], bool]


def wait_for_wake(wake: threading.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; a nudge (``wake`` set) or a stop ends the sleep at once."""
    return wake.wait(seconds)


class PollingLoop:
    """Runs ``tick`` in a thread of its own until stopped."""

    def __init__(
        self,
        name: str,
        tick: Callable[[], int],
        *,
        poll_interval: float,
        idle_max_sleep: float,
        wait: Wait | None = None,
    ) -> None:
        self.name = name
        self._tick = tick
        self._poll_interval = poll_interval
        self._idle_max_sleep = idle_max_sleep
        # looked up here, not bound as the parameter's default, so a test can watch every loop's sleeps
        self._wait: Wait = wait if wait is not None else wait_for_wake
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
            # cleared before the tick, so a nudge that comes during the tick ends the sleep after it
            self._wake.clear()
            try:
                done = self._tick()
            except Exception:
                log.exception("loop tick failed", extra={"loop": self.name})
                done = 0
            if done:
                sleep = self._poll_interval
                continue
            self._wait(self._wake, sleep)
            sleep = min(sleep * 2, self._idle_max_sleep)
