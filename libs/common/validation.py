"""Field validators shared by the domain's input types."""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from libs.common.errors import InvalidInput

_E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
_TAG = re.compile(r"^[\w][\w .:/-]{0,63}$", re.UNICODE)
_TIMEZONES = frozenset(available_timezones())


def phone(value: str, field: str = "phone") -> str:
    """An E.164 phone number (``+`` then 7 to 15 digits); spaces, dashes and brackets are dropped."""
    compact = re.sub(r"[\s\-()]", "", value)
    if not _E164.match(compact):
        raise InvalidInput(f"{field} must be an E.164 phone number such as +14155550123", field=field)
    return compact


def timezone(value: str, field: str = "timezone") -> str:
    """An IANA time zone name, such as Europe/Lisbon."""
    if value not in _TIMEZONES:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidInput(
                f"{field} must be an IANA time zone such as Europe/Lisbon", field=field
            ) from None
    return value


def tag(value: str, field: str = "tags") -> str:
    """A tag: 1 to 64 characters, letters, digits and ``_ .:/-``, not starting with punctuation."""
    value = value.strip()
    if not _TAG.match(value):
        raise InvalidInput(
            f"{field}: {value!r} is not a valid tag (1-64 letters, digits, _ .:/-)", field=field
        )
    return value
