"""Message templates for follow-up steps: parse (and reject) at publish time, render at release time.

Syntax
    ``{{ path }}`` or ``{{ path | "fallback" }}``; whitespace inside the braces is free. A path is
    dot-separated segments, each ``[A-Za-z_][A-Za-z0-9_]*``, under one of three roots:

    ``vars.<path>``                     the enrollment's variables (nesting allowed: ``vars.order.id``)
    ``anchor.date|time|datetime|weekday``  the enrollment's ``anchor_at`` in the contact's time zone
    ``contact.name`` / ``contact.phone`` / ``contact.attributes.<path>``

    The fallback is a double-quoted string; ``\\"`` and ``\\\\`` are its only escapes (any other
    backslash is malformed). It may contain braces.

Braces
    ``{{`` always opens a placeholder and ``}}`` always closes one; there is no escape for a literal
    ``{{``. A single ``{`` or ``}`` is literal text (``{name}``, ``a } b``). A third brace touching a
    placeholder (``{{{vars.x}}}``, ``{{vars.x}}}``) is rejected as ambiguous instead of guessing which
    pair was meant, and a ``}}`` outside a placeholder is rejected as stray.

Values
    Strings render as they are (never re-expanded), numbers with ``str()``, booleans as ``true`` /
    ``false``. A missing key, ``null``, an object or a list is *missing*; an empty string is a value.
    Anchor formats: date ``%Y-%m-%d``, time ``%H:%M``, datetime ``%Y-%m-%d %H:%M``, weekday the full
    English name (not locale dependent). The zone is the contact's, else the project's, else UTC; an
    unknown zone name falls through to the next. A naive ``anchor_at`` is taken as UTC.

Skipping
    A missing value without a fallback makes :func:`render` return a skip reason instead of text, so
    nothing is sent with a hole in it: ``missing_variable`` with the placeholder's path as its detail
    (``vars.first_name``, ``contact.name``), or ``missing_anchor`` (no ``anchor_at``). The first missing
    placeholder in the text names the reason.

A message
    :func:`render_message` is how every message's text is rendered (a step's at release, a rule's
    send-message action, the dashboard's step preview): :func:`render`, then the length limit. A text
    within :data:`~libs.common.contracts.limits.MAX_MESSAGE_LENGTH` as written that its values made longer
    is not sent (WhatsApp would refuse it): its reason is ``message_too_long``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from libs.common.contracts.limits import MAX_MESSAGE_LENGTH

__all__ = [
    "TOO_LONG_REASON",
    "MissingValue",
    "RenderContext",
    "Rendered",
    "Template",
    "TemplateError",
    "TemplateSkip",
    "parse_template",
    "render",
    "render_message",
]

#: Why a placeholder without a fallback leaves a hole: its value is missing (``missing_variable``, the
#: placeholder's path as the detail), or the enrollment has no ``anchor_at`` (``missing_anchor``).
MissingValue = Literal["missing_variable", "missing_anchor"]
#: Why a text is not rendered: a missing value, or the text its values make is too long.
TemplateSkip = Literal[MissingValue, "message_too_long"]

#: Why a message is not sent whose text, its placeholders filled in, is longer than a message may be.
TOO_LONG_REASON: Final = "message_too_long"

#: The roots a placeholder path may start with.
ROOTS = ("vars", "anchor", "contact")
#: ``anchor.<field>`` names.
ANCHOR_FIELDS = ("date", "time", "datetime", "weekday")
#: ``contact.<field>`` names; ``attributes`` takes a key path after it.
CONTACT_FIELDS = ("name", "phone", "attributes")
#: Distinct templates whose parse is kept (the release path renders the same few over and over).
PARSE_CACHE_SIZE = 1024
#: Longest excerpt of the source quoted in an error about an unclosed placeholder.
_EXCERPT = 40

_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
#: The next ``{{`` or ``}}`` in literal text.
_DELIMITER = re.compile(r"\{\{|\}\}")
#: A whole placeholder: anything but quotes and braces, double-quoted strings, or a lone ``}``.
_PLACEHOLDER = re.compile(r'\{\{((?:[^"{}]|"(?:[^"\\]|\\.)*"|\}(?!\}))*)\}\}', re.DOTALL)
#: A placeholder's body: the path, then an optional ``|`` and fallback.
_BODY = re.compile(r"\s*([^|]*?)\s*(?:\|(.*))?", re.DOTALL)
_FALLBACK = re.compile(r'\s*"((?:[^"\\]|\\["\\])*)"\s*', re.DOTALL)
_FALLBACK_ESCAPE = re.compile(r"\\(.)")
#: One segment of a placeholder's path (``first_name`` in ``vars.first_name``): a variable's name.
SEGMENT_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
_SEGMENT = re.compile(SEGMENT_PATTERN)

Kind = Literal["vars", "anchor", "contact_name", "contact_phone", "contact_attribute"]


class TemplateError(ValueError):
    """The template has a malformed placeholder."""

    def __init__(self, message: str, placeholder: str) -> None:
        #: The offending placeholder as written (or the stray delimiter).
        self.placeholder = placeholder
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class _Placeholder:
    """One parsed ``{{ ... }}``."""

    raw: str
    path: str
    kind: Kind
    #: The key path below the root (``vars``, ``contact.attributes``) or the anchor field.
    keys: tuple[str, ...]
    fallback: str | None
    #: The skip reason when the value is missing and there is no fallback (its detail is :attr:`path`).
    missing: MissingValue


_Part = str | _Placeholder


@dataclass(frozen=True)
class Template:
    """A parsed template; build one with :func:`parse_template`."""

    source: str
    #: Literal text and placeholders, in order (internal).
    parts: tuple[_Part, ...] = field(repr=False, compare=False)

    def placeholders(self) -> list[str]:
        """The placeholder paths in order of first appearance, each once: ``["vars.first_name", ...]``."""
        return list(dict.fromkeys(p.path for p in self.parts if isinstance(p, _Placeholder)))

    def unguarded(self) -> dict[str, MissingValue]:
        """The placeholders without a fallback whose value an enrollment may lack (every one but
        ``contact.phone``), each once, with the skip reason it then causes: ``{"vars.plan":
        "missing_variable"}``."""
        return {
            p.path: p.missing
            for p in self.parts
            if isinstance(p, _Placeholder) and p.fallback is None and p.kind != "contact_phone"
        }


class RenderContext(msgspec.Struct, frozen=True):
    """What a template can draw on for one enrollment."""

    variables: Mapping[str, Any]
    #: Timezone-aware; a naive value is taken as UTC.
    anchor_at: datetime | None
    #: The contact's IANA zone, or None.
    timezone: str | None
    #: The project's zone.
    fallback_timezone: str
    contact_name: str | None
    contact_phone: str | None
    contact_attributes: Mapping[str, Any]


class Rendered(msgspec.Struct, frozen=True):
    """Either the text to send, or why the step is skipped (and the missing placeholder's path)."""

    text: str | None
    skip_reason: TemplateSkip | None
    #: The path of the placeholder whose value is missing (``missing_variable``).
    skip_detail: str | None = None


def parse_template(source: str) -> Template:
    """Parse ``source``, raising :class:`TemplateError` naming the first malformed placeholder.

    Parses are cached (:data:`PARSE_CACHE_SIZE` distinct sources); a rejection is not.
    """
    return _parse(source)


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def _parse(source: str) -> Template:
    parts: list[_Part] = []
    position = 0
    while (found := _DELIMITER.search(source, position)) is not None:
        start = found.start()
        if found.group() == "}}":
            raise TemplateError(
                f'stray "}}}}" without an opening "{{{{" at character {start}: '
                f"{_excerpt(source[max(0, start - _EXCERPT) : start + 2])!r}",
                "}}",
            )
        if source.startswith("{", start + 2):
            raw = _raw_at(source, start)
            raise TemplateError(f'ambiguous braces in "{raw}": a placeholder is exactly {{{{ ... }}}}', raw)
        match = _PLACEHOLDER.match(source, start)
        if match is None:
            end = source.find("}}", start + 2)
            if end == -1:
                raw = _excerpt(source[start:])
                raise TemplateError(f'unclosed placeholder "{raw}": "{{{{" without a matching "}}}}"', raw)
            raw = source[start : end + 2]
            _placeholder(raw, raw[2:-2])  # raises the specific problem
            raise TemplateError(f'malformed placeholder "{raw}"', raw)  # pragma: no cover - a safety net
        end = match.end()
        raw = match.group()
        if source.startswith("}", end):
            raw = source[start : end + 1]
            raise TemplateError(f'ambiguous braces in "{raw}": a placeholder is exactly {{{{ ... }}}}', raw)
        if start > position:
            parts.append(source[position:start])
        parts.append(_placeholder(raw, match.group(1)))
        position = end
    if position < len(source):
        parts.append(source[position:])
    return Template(source, tuple(parts))


def render(template: Template | str, context: RenderContext) -> Rendered:
    """The text for ``context``, or the skip reason of the first missing value without a fallback.

    A ``str`` is parsed (cached) first, so a malformed one raises :class:`TemplateError`.
    """
    if isinstance(template, str):
        template = parse_template(template)
    out: list[str] = []
    local: datetime | None = None
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            continue
        value: str | None
        if part.kind == "anchor":
            if context.anchor_at is None:
                value = None
            else:
                if local is None:
                    local = _local_anchor(context)
                value = _anchor_field(local, part.keys[0])
        elif part.kind == "vars":
            value = _text(_lookup(context.variables, part.keys))
        elif part.kind == "contact_name":
            value = context.contact_name
        elif part.kind == "contact_phone":
            value = context.contact_phone
        else:
            value = _text(_lookup(context.contact_attributes, part.keys))
        if value is None:
            if part.fallback is None:
                detail = part.path if part.missing == "missing_variable" else None
                return Rendered(text=None, skip_reason=part.missing, skip_detail=detail)
            value = part.fallback
        out.append(value)
    return Rendered(text="".join(out), skip_reason=None)


def render_message(template: Template | str, context: RenderContext) -> Rendered:
    """A message's text for ``context``, as :func:`render`, or :data:`TOO_LONG_REASON` when the text it
    renders to is longer than :data:`MAX_MESSAGE_LENGTH` (never a truncated text)."""
    rendered = render(template, context)
    if rendered.text is not None and len(rendered.text) > MAX_MESSAGE_LENGTH:
        return Rendered(text=None, skip_reason=TOO_LONG_REASON)
    return rendered


def _placeholder(raw: str, body: str) -> _Placeholder:
    """Check and parse one placeholder's ``body`` (the text between the braces)."""
    match = _BODY.fullmatch(body)
    assert match is not None  # _BODY matches any text
    path, fallback_source = match.group(1), match.group(2)
    if not path:
        raise TemplateError(f'empty placeholder "{raw}": name a value such as {{{{ vars.first_name }}}}', raw)
    fallback: str | None = None
    if fallback_source is not None:
        quoted = _FALLBACK.fullmatch(fallback_source)
        if quoted is None:
            raise TemplateError(
                f'malformed fallback in "{raw}": after "|" write one double-quoted string such as "there" '
                '(escape a quote as \\" and a backslash as \\\\)',
                raw,
            )
        fallback = _FALLBACK_ESCAPE.sub(r"\1", quoted.group(1))
    segments = path.split(".")
    root = segments[0]
    if root not in ROOTS:
        raise TemplateError(
            f'unknown placeholder "{raw}": it must start with vars., anchor. or contact.', raw
        )
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            raise TemplateError(
                f'bad path segment {segment!r} in "{raw}": segments are letters, digits and underscores, '
                "not starting with a digit",
                raw,
            )
    kind: Kind
    keys = tuple(segments[1:])
    if root == "vars":
        if not keys:
            raise TemplateError(
                f'incomplete placeholder "{raw}": name a variable such as vars.first_name', raw
            )
        kind = "vars"
    elif root == "anchor":
        if len(keys) != 1 or keys[0] not in ANCHOR_FIELDS:
            raise TemplateError(
                f'unknown placeholder "{raw}": anchor fields are {", ".join(ANCHOR_FIELDS)}', raw
            )
        kind = "anchor"
    elif keys[:1] == ("attributes",) and len(keys) > 1:
        kind, keys = "contact_attribute", keys[1:]
    elif keys in (("name",), ("phone",)):
        kind = "contact_name" if keys == ("name",) else "contact_phone"
    else:
        raise TemplateError(
            f'unknown placeholder "{raw}": contact fields are name, phone and attributes.<key>', raw
        )
    missing: MissingValue = "missing_anchor" if kind == "anchor" else "missing_variable"
    return _Placeholder(raw=raw, path=path, kind=kind, keys=keys, fallback=fallback, missing=missing)


def _lookup(values: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    value: Any = values
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _text(value: Any) -> str | None:
    """``value`` as message text, or None when it cannot be rendered (null, object, list)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None or isinstance(value, Mapping | list | tuple):
        return None
    return str(value)


def _local_anchor(context: RenderContext) -> datetime:
    anchor = context.anchor_at
    assert anchor is not None
    if anchor.tzinfo is None:
        anchor = anchor.replace(tzinfo=UTC)
    zone = _zone(context.timezone) or _zone(context.fallback_timezone) or UTC
    try:
        return anchor.astimezone(zone)
    except OverflowError:  # hours from year 1 or 9999, the local time leaves the calendar (UTC's does not)
        return anchor.astimezone(UTC)


def _anchor_field(local: datetime, name: str) -> str:
    if name == "date":
        return f"{local.year:04d}-{local.month:02d}-{local.day:02d}"
    if name == "time":
        return f"{local.hour:02d}:{local.minute:02d}"
    if name == "datetime":
        return f"{local.year:04d}-{local.month:02d}-{local.day:02d} {local.hour:02d}:{local.minute:02d}"
    return _WEEKDAYS[local.weekday()]


@functools.lru_cache(maxsize=512)
def _zone(name: str | None) -> tzinfo | None:
    """The IANA zone ``name``, or None when it is empty or unknown."""
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder such as "Europe"
        return None


def _raw_at(source: str, start: int) -> str:
    """The placeholder-ish text starting at ``start``, for an error message."""
    end = source.find("}}", start)
    if end == -1:
        return _excerpt(source[start:])
    while source.startswith("}", end + 2):
        end += 1
    return source[start : end + 2]


def _excerpt(text: str) -> str:
    text = text.split("\n", 1)[0]
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."
