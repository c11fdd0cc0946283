"""Field validators shared by the domain's input types, with the size limits of what the engine stores.

Each limit is one constant of :mod:`libs.common.contracts.limits`, used twice: by the ``Annotated`` types
input structs give their fields (msgspec checks them when a REST body or a broker message is decoded, and
the OpenAPI schema is generated from them), and by the checks below, which the domain runs on values
however they came, so a value built in code meets the same limits. A refused value is an
:class:`InvalidInput` (422) naming its field:

- :func:`name`: a contact's, sequence's, number's, rule's or campaign's name, 1 to 200 characters, not
  blank;
- :func:`message_text`: a message's text (a template), at most 4,096 characters (WhatsApp's limit);
- :func:`json_value`: an object stored as given (``attributes``, template ``variables``), at most 16 KB
  as compact JSON, no NUL character anywhere;
- :func:`text`: any text, no NUL character, at most 65,536 characters unless its field has a lower limit.

docs/api.md ("Limits") lists every limit.
"""

from __future__ import annotations

import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import msgspec

from libs.common.contracts.limits import (
    MAX_JSON_BYTES,
    MAX_KEY_LENGTH,
    MAX_MESSAGE_LENGTH,
    MAX_NAME_LENGTH,
    MAX_TEXT_LENGTH,
    MAX_VARIABLES,
    TAG_PATTERN,
)
from libs.common.core.errors import InvalidInput

_E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
#: No empty or "." segment between slashes, so a tag survives a trip through a URL path.
_TAG = re.compile(TAG_PATTERN, re.UNICODE)
_TIMEZONES = frozenset(available_timezones())
_JSON = msgspec.json.Encoder()


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


def text(value: str, field: str, *, max_length: int = MAX_TEXT_LENGTH) -> str:
    """Text PostgreSQL can store (no NUL character), at most ``max_length`` characters."""
    if "\x00" in value:
        raise InvalidInput(f"{field} must not contain NUL characters", field=field)
    if len(value) > max_length:
        raise InvalidInput(f"{field} must be at most {max_length} characters", field=field)
    return value


def name(value: str, field: str = "name") -> str:
    """A name, stripped: 1 to :data:`MAX_NAME_LENGTH` characters."""
    value = text(value, field).strip()
    if not 1 <= len(value) <= MAX_NAME_LENGTH:
        raise InvalidInput(f"{field} must be 1 to {MAX_NAME_LENGTH} characters", field=field)
    return value


def message_text(value: str, field: str = "text") -> str:
    """A message's text (a template): at most :data:`MAX_MESSAGE_LENGTH` characters."""
    return text(value, field, max_length=MAX_MESSAGE_LENGTH)


def json_value(value: Any, field: str, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A decoded JSON value PostgreSQL can store as jsonb: no NUL character in any key or string; an object
    at most ``max_bytes`` encoded (attributes, template variables)."""
    if isinstance(value, dict):
        try:
            size = len(_JSON.encode(value))
        except (TypeError, ValueError, OverflowError):  # not JSON at all: refused below, naming the value
            size = 0
        if size > max_bytes:
            raise InvalidInput(
                f"{field} must be at most {max_bytes} bytes as JSON (it is {size})", field=field
            )
    return _storable(value, field)


def keyed(value: dict[str, Any], field: str, *, max_keys: int = MAX_VARIABLES) -> dict[str, Any]:
    """An object of named values (template variables): at most ``max_keys`` keys of 1 to
    :data:`MAX_KEY_LENGTH` characters, then as :func:`json_value` (a key's error names it)."""
    if len(value) > max_keys:
        raise InvalidInput(f"{field} has at most {max_keys} keys", field=field)
    for key in value:
        if not 1 <= len(key) <= MAX_KEY_LENGTH:
            raise InvalidInput(f"{field} names are 1 to {MAX_KEY_LENGTH} characters", field=f"{field}.{key}")
    json_value(value, field)
    return value


def _storable(value: Any, field: str) -> Any:
    if isinstance(value, str):
        text(value, field)
    elif isinstance(value, dict):
        for key, item in value.items():
            _storable(item, f"{field}.{text(key, field)}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _storable(item, f"{field}.{index}")
    return value


def tag(value: str, field: str = "tags") -> str:
    """A tag: 1 to 64 characters, letters, digits and ``_ .:/-``, not starting with punctuation."""
    value = value.strip()
    if not _TAG.match(value):
        raise InvalidInput(
            f"{field}: {value!r} is not a valid tag (1-64 letters, digits, _ .:/-)", field=field
        )
    return value
