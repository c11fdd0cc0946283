"""Polling loops: how workers make progress without depending on the broker.

A loop calls its ``tick`` (which returns how much work it did) over and over while there is work;
when idle it sleeps, starting at the poll interval and doubling up to the idle maximum. A broker nudge
calls :meth:`PollingLoop.wake` to cut the sleep short. RabbitMQ down means slower, not stopped.

A loop that knows when its next work falls due (``next_due``: the release knows the earliest
``next_run_at``) sleeps until then instead, never longer than the poll interval: a step scheduled hours
ago goes out at its time, not up to an idle sleep late, and work nobody announced (a nudge lost with
RabbitMQ down) waits one poll interval at most.

How a loop sleeps is a function of its own (``wait``, by default :func:`wait_for_wake`), so a test can
record the sleeps a loop asks for and drive its ticks without waiting for real time to pass.

A tick that fails because PostgreSQL is out of reach is no error of the loop's: it is reported to the
process's :data:`~libs.common.core.db.DATABASE` outage (one warning for the outage, one info when a
connection is made again), never a traceback per tick; any other failure is logged with its traceback.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from libs.common.core.db import DATABASE, server_unavailable
from libs.common.core.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

#: Seconds until a loop's next known work falls due (0 or less: due now), or None when it knows of none.
NextDue = Callable[[], float | None]

#: A wake-up this much after a due time, so the claim's clock reading is past it.
DUE_MARGIN_SECONDS = 0.001

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
        next_due: NextDue | None = None,
    ) -> None:
        self.name = name
        self._tick = tick
        self._poll_interval = poll_interval
        self._idle_max_sleep = idle_max_sleep
        self._next_due = next_due
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
            except Exception as exc:
                if not _database_lost(exc):
                    log.exception("loop tick failed", extra={"loop": self.name})
                done = 0
            if done:
                sleep = self._poll_interval
                continue
            until = self._until_next_due()
            if until is not None:
                self._wait(self._wake, until)
                continue
            self._wait(self._wake, sleep)
            sleep = min(sleep * 2, self._idle_max_sleep)

    def _until_next_due(self) -> float | None:
        """How long to sleep for the next known work (at most the poll interval); None: back off as usual
        (no ``next_due``, or it failed: the database is unreachable)."""
        if self._next_due is None:
            return None
        try:
            seconds = self._next_due()
        except Exception as exc:
            if not _database_lost(exc):
                log.warning("next due time unknown", extra={"loop": self.name}, exc_info=True)
            return None
        if seconds is None:
            return self._poll_interval
        return min(max(seconds, 0.0) + DUE_MARGIN_SECONDS, self._poll_interval)


def _database_lost(exc: Exception) -> bool:
    """Whether ``exc`` says PostgreSQL is out of reach; if so it is reported to :data:`DATABASE`."""
    cause = exc.__cause__ if isinstance(exc, DatabaseUnavailable) and exc.__cause__ is not None else exc
    if isinstance(exc, DatabaseUnavailable) or server_unavailable(cause):
        DATABASE.failed(cause)
        return True
    return False
