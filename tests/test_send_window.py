"""Send windows in local time: crossing midnight, weekdays, and the days the clocks change."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from libs.common.core.errors import InvalidInput
from libs.common.followups.send_window import SendWindow, first_instant, next_opening, validate_window, zone

LISBON = ZoneInfo("Europe/Lisbon")
NEW_YORK = ZoneInfo("America/New_York")
NINE_TO_FIVE = SendWindow(start="09:00", end="17:00")


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def test_inside_the_window_is_now() -> None:
    moment = utc(2030, 1, 7, 12, 0)  # a Monday, 12:00 in Lisbon (UTC+0 in winter)
    assert next_opening(NINE_TO_FIVE, moment, LISBON) == moment


def test_before_the_window_waits_for_its_opening_and_after_it_for_the_next_day() -> None:
    assert next_opening(NINE_TO_FIVE, utc(2030, 1, 7, 3, 0), LISBON) == utc(2030, 1, 7, 9, 0)
    assert next_opening(NINE_TO_FIVE, utc(2030, 1, 7, 17, 0), LISBON) == utc(2030, 1, 8, 9, 0)


def test_the_window_is_in_the_contacts_zone() -> None:
    # 12:00 UTC is 07:00 in New York in January: two hours before the window opens there
    assert next_opening(NINE_TO_FIVE, utc(2030, 1, 7, 12, 0), NEW_YORK) == utc(2030, 1, 7, 14, 0)


def test_a_window_crossing_midnight_belongs_to_the_day_it_opens() -> None:
    night = SendWindow(start="21:00", end="08:00", days=["fri"])
    friday_evening = utc(2030, 1, 11, 22, 0)
    saturday_early = utc(2030, 1, 12, 7, 59)
    assert next_opening(night, friday_evening, LISBON) == friday_evening
    assert next_opening(night, saturday_early, LISBON) == saturday_early  # still Friday's window
    # Saturday 08:00 it closed; the next opening is the next Friday 21:00
    assert next_opening(night, utc(2030, 1, 12, 8, 0), LISBON) == utc(2030, 1, 18, 21, 0)
    # Friday before 21:00: the window has not opened yet
    assert next_opening(night, utc(2030, 1, 11, 12, 0), LISBON) == utc(2030, 1, 11, 21, 0)


def test_excluded_weekdays_are_skipped() -> None:
    weekdays = SendWindow(start="09:00", end="17:00", days=["mon", "tue", "wed", "thu", "fri"])
    saturday_noon = utc(2030, 1, 12, 12, 0)
    assert next_opening(weekdays, saturday_noon, LISBON) == utc(2030, 1, 14, 9, 0)  # Monday


@pytest.mark.parametrize(
    ("tz", "day", "jump_utc"),
    [
        # Lisbon 2030-03-31: 01:00 WET -> 02:00 WEST at 01:00 UTC
        (LISBON, (2030, 3, 31), utc(2030, 3, 31, 1, 0)),
        # New York 2030-03-10: 02:00 EST -> 03:00 EDT at 07:00 UTC
        (NEW_YORK, (2030, 3, 10), utc(2030, 3, 10, 7, 0)),
    ],
)
def test_a_window_opening_in_the_spring_forward_gap_opens_when_the_clock_jumps(
    tz: ZoneInfo, day: tuple[int, int, int], jump_utc: datetime
) -> None:
    gap = "01:30" if tz is LISBON else "02:30"
    window = SendWindow(start=gap, end="12:00")
    night_before = first_instant(datetime(*day).date(), datetime.min.time(), tz)  # local midnight
    assert next_opening(window, night_before, tz) == jump_utc
    assert next_opening(window, jump_utc, tz) == jump_utc  # open from the jump on


@pytest.mark.parametrize(
    ("tz", "day", "first_utc", "second_utc"),
    [
        # Lisbon 2030-10-27: 02:00 WEST -> 01:00 WET at 01:00 UTC; 01:30 happens at 00:30 and 01:30 UTC
        (LISBON, (2030, 10, 27), utc(2030, 10, 27, 0, 30), utc(2030, 10, 27, 1, 30)),
        # New York 2030-11-03: 02:00 EDT -> 01:00 EST at 06:00 UTC; 01:30 at 05:30 and 06:30 UTC
        (NEW_YORK, (2030, 11, 3), utc(2030, 11, 3, 5, 30), utc(2030, 11, 3, 6, 30)),
    ],
)
def test_a_window_opening_in_the_fall_back_overlap_opens_at_the_first_of_the_two(
    tz: ZoneInfo, day: tuple[int, int, int], first_utc: datetime, second_utc: datetime
) -> None:
    window = SendWindow(start="01:30", end="12:00")
    night_before = first_instant(datetime(*day).date(), datetime.min.time(), tz)
    assert next_opening(window, night_before, tz) == first_utc
    assert next_opening(window, second_utc, tz) == second_utc  # still inside (it opened an hour before)


def test_a_window_closing_in_the_overlap_closes_at_the_first_of_the_two() -> None:
    window = SendWindow(start="00:00", end="01:30")
    # Lisbon 2030-10-27: 01:30 first happens at 00:30 UTC, the window is closed after it
    assert next_opening(window, utc(2030, 10, 27, 0, 29), LISBON) == utc(2030, 10, 27, 0, 29)
    assert next_opening(window, utc(2030, 10, 27, 0, 30), LISBON) == utc(2030, 10, 28, 0, 0)


def test_a_contact_without_a_zone_uses_the_projects_then_utc() -> None:
    assert zone(None, "America/New_York") == NEW_YORK
    assert zone("Nowhere/Atlantis", "Europe/Lisbon") == LISBON
    assert zone(None, None) == UTC


@pytest.mark.parametrize(
    ("window", "field"),
    [
        (SendWindow(start="9:00", end="17:00"), "w.start"),
        (SendWindow(start="09:00", end="24:00"), "w.end"),
        (SendWindow(start="09:00", end="09:00"), "w"),
        (SendWindow(start="09:00", end="17:00", days=[]), "w.days"),
        (SendWindow(start="09:00", end="17:00", days=["mon", "mon"]), "w.days"),
    ],
)
def test_a_window_that_cannot_open_is_rejected_naming_the_field(window: SendWindow, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_window(window, "w")
    assert raised.value.field == field
