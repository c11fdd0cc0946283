"""Field validators shared by the domain's input types."""

from __future__ import annotations

import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from libs.common.core.errors import InvalidInput

_E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
#: No empty or "." segment between slashes, so a tag survives a trip through a URL path.
_TAG = re.compile(r"^(?!.*//)(?!.*/\.?$)(?!.*/\./)[\w][\w .:/-]{0,63}$", re.UNICODE)
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
        except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder such as "Europe"
            raise InvalidInput(
                f"{field} must be an IANA time zone such as Europe/Lisbon", field=field
            ) from None
    return value


def text(value: str, field: str) -> str:
    """Text PostgreSQL can store: no NUL character."""
    if "\x00" in value:
        raise InvalidInput(f"{field} must not contain NUL characters", field=field)
    return value


def json_value(value: Any, field: str) -> Any:
    """A decoded JSON value PostgreSQL can store as jsonb: no NUL character in any key or string."""
    if isinstance(value, str):
        text(value, field)
    elif isinstance(value, dict):
        for key, item in value.items():
            json_value(item, f"{field}.{text(key, field)}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            json_value(item, f"{field}.{index}")
    return value


def tag(value: str, field: str = "tags") -> str:
    """A tag: 1 to 64 characters, letters, digits and ``_ .:/-``, not starting with punctuation."""
    value = value.strip()
    if not _TAG.match(value):
        raise InvalidInput(
            f"{field}: {value!r} is not a valid tag (1-64 letters, digits, _ .:/-)", field=field
        )
    return value
