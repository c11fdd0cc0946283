"""Send windows: the local hours and weekdays in which follow-ups may go out.

A window opens at ``start`` on each of its ``days`` in the contact's time zone (else the project's) and
closes at ``end`` the same day, or the next day when ``end`` is not after ``start`` (21:00-08:00 crosses
midnight and belongs to the day it opens on: "fri 21:00-08:00" runs Friday 21:00 to Saturday 08:00).

Wall-clock times are taken as the first instant the clock shows them: in the spring-forward gap (02:30 that
never happens) that is the instant the clock jumps; in the fall-back overlap (01:30 that happens twice)
the first of the two. A release outside its window is deferred to the next opening, never skipped.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from libs.common.contracts.limits import Clock
from libs.common.core.errors import Refusals

Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

#: Weekday names in ``date.weekday()`` order.
WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

_CLOCK = re.compile(r"([01]\d|2[0-3]):([0-5]\d)")


class SendWindow(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Local opening hours for follow-ups: ``start`` and ``end`` as ``HH:MM``, on ``days``."""

    start: Clock
    end: Clock
    #: At least one, each once.
    days: Annotated[list[Weekday], msgspec.Meta(extra_json_schema={"minItems": 1, "uniqueItems": True})] = (
        msgspec.field(default_factory=lambda: list(WEEKDAYS))
    )


def validate_window(window: SendWindow, field: str) -> SendWindow:
    """A window that can open: valid clock times, start and end apart, at least one day, no repeats
    (every error at once)."""
    refusals = Refusals()
    for name in ("start", "end"):
        if not _CLOCK.fullmatch(getattr(window, name)):
            refusals.add(f"{field}.{name}", f"{name} must be a 24-hour time HH:MM")
    if window.start == window.end:
        refusals.add(field, "start and end must differ (a window that never closes is no window)")
    if not window.days:
        refusals.add(f"{field}.days", "a window needs at least one day")
    if len(set(window.days)) != len(window.days):
        refusals.add(f"{field}.days", "a day is given twice")
    refusals.raise_any()
    return window


def zone(name: str | None, fallback: str | None) -> tzinfo:
    """The contact's zone, else the project's, else UTC (an unknown name falls through to the next)."""
    for candidate in (name, fallback):
        if candidate:
            try:
                return ZoneInfo(candidate)
            except (ZoneInfoNotFoundError, ValueError):
                continue
    return UTC


def _clock(value: str) -> time:
    hours, minutes = value.split(":")
    return time(int(hours), int(minutes))


def first_instant(day: date, at: time, tz: tzinfo) -> datetime:
    """The first instant (UTC) the wall clock in ``tz`` shows ``at`` on ``day``, or the instant it jumps
    past it (a time in the spring-forward gap)."""
    local = datetime.combine(day, at)
    earlier = local.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if earlier.astimezone(tz).replace(tzinfo=None) == local:
        return earlier  # it exists (the first of two in a fall-back overlap)
    # a gap: the jump lies between the two readings of ``local``; find the first instant at or after it
    low, high = sorted((earlier, local.replace(tzinfo=tz, fold=1).astimezone(UTC)))
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(tz).replace(tzinfo=None) >= local:
            high = middle
        else:
            low = middle
    return high.replace(microsecond=0)


def _opening(window: SendWindow, day: date, tz: tzinfo) -> tuple[datetime, datetime]:
    """When the window of ``day`` opens and closes (UTC)."""
    start, end = _clock(window.start), _clock(window.end)
    closes_on = day + timedelta(days=1) if end <= start else day
    return first_instant(day, start, tz), first_instant(closes_on, end, tz)


def _current_or_next(window: SendWindow, moment: datetime, tz: tzinfo) -> tuple[datetime, datetime]:
    """The window open at ``moment`` (from ``moment``), or the next one: when it opens and closes (UTC)."""
    days = {WEEKDAYS.index(d) for d in window.days}
    today = moment.astimezone(tz).date()
    # the window opened yesterday may still be open (it crosses midnight); then today's, and the week after
    for offset in range(-1, 8):
        day = today + timedelta(days=offset)
        if day.weekday() not in days:
            continue
        opens, closes = _opening(window, day, tz)
        if moment < closes:
            return max(moment, opens), closes
    raise AssertionError("a window with at least one day opens within a week")  # pragma: no cover


def next_opening(window: SendWindow, moment: datetime, tz: tzinfo) -> datetime:
    """``moment`` when it is inside the window, else the window's next opening (UTC)."""
    return _current_or_next(window, moment, tz)[0]


def add_open_time(window: SendWindow, start: datetime, duration: timedelta, tz: tzinfo) -> datetime:
    """The instant at which ``duration`` of the window's open time has passed since ``start`` (business
    hours: 4 hours from Friday 16:00 with 09:00-17:00 Monday to Friday is Monday 12:00)."""
    left, moment = duration, start
    while True:
        opens, closes = _current_or_next(window, moment, tz)
        if opens + left <= closes:
            return opens + left
        left -= closes - opens
        moment = closes
