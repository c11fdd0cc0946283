"""The one clock every piece of due-time logic reads.

`now` is taken here and passed into SQL as a parameter; no due-time query calls ``now()``. Production
uses :class:`SystemClock`; tests drive a :class:`ManualClock`, so "24 hours later" is a call, not a sleep.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to (tests, simulations)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now

    def set(self, moment: datetime) -> None:
        if moment.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware datetime")
        with self._lock:
            self._now = moment


#: The production clock.
SYSTEM_CLOCK: Clock = SystemClock()
