"""Decoding a value into its type with every refusal at once, each in plain words.

msgspec stops at the first field it refuses. :func:`refusals` decodes again with the refused value set
aside (a field dropped, a list item taken out, its later siblings keeping their own indexes), until the
value decodes or :data:`MAX_REFUSALS` are found: a definition with four bad steps answers four errors. A
field whose absence a later pass reports ("text is required" after "text must be text") is reported
once. What is left decodes (:class:`Salvaged`), so the checks that follow decoding run on it too, and
:meth:`Salvaged.named` names their errors as in the value given (a list's later items keep their indexes).

:func:`plain` words msgspec's message for a person, from the type at the refused path: the allowed values
(``kind is one of message, ai (not 'sms')``), the bounds (``delay_seconds must be a whole number from 0 to
31622400``), the fields an object takes. :data:`PATTERNS` says in words what a pattern of a field means
(a module with such a field adds its own).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from msgspec import inspect as mi

from libs.common.core.errors import InvalidInput

#: Most refusals one value is answered with (each is one more decoding pass).
MAX_REFUSALS = 50

#: What a value that does not match a pattern must be, in words (msgspec's own message shows the regex).
PATTERNS: dict[str, str] = {}

_AT = re.compile(r"^(.*?)(?: - at `(\$[^`]*)`)?$", re.DOTALL)
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")
_NAMED = re.compile(r"^Object (missing required|contains unknown) field `([^`]+)`$")
_EXPECTED = re.compile(r"^Expected `([^`]+)`, got `([^`]+)`$")
_BOUND = re.compile(r"^Expected `[^`]+` (?:>=|<=|>|<|of length|that's a multiple of)")
_REGEX = re.compile(r"^Expected `str` matching regex '(.*)'$", re.DOTALL)
_INVALID = re.compile(r"^Invalid (?:enum )?value (.+)$")

#: msgspec's type names, in words.
_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
    "datetime": "an RFC 3339 time such as 2025-03-01T14:00:00Z",
    "date": "a date such as 2025-03-01",
    "uuid": "a uuid",
}

#: What a value of the wrong type is, where the words above would read oddly ("a number, not a number").
_GOT = {"float": "a number with a decimal point", "str": "a string"}

Segment = str | int


@dataclass(frozen=True)
class Refusal:
    """One refused field: its dotted path, msgspec's message (what the HTTP status is decided on) and
    the message in plain words."""

    field: str
    raw: str
    message: str


def decode(raw: Any, target: Any, field: str = "") -> Any:
    """``raw`` (JSON-like data) as ``target``, strictly; refused, an :class:`InvalidInput` naming every
    refused field (under ``field``) in plain words."""
    value, refused = salvage(raw, target, field)
    if refused:
        raise InvalidInput.every(refused)
    return value


def salvage(raw: Any, target: Any, field: str = "") -> tuple[Any | None, list[tuple[str, str]]]:
    """``raw`` as ``target`` and every ``(field, message)`` refused in it: the value is decoded from what
    is left once the refused parts are set aside (their defaults in their place; None when nothing is
    left), so the checks that follow decoding can be run on it too and their errors answered at once."""
    found = salvaged(raw, target)
    return found.value, [(_join(field, r.field), r.message) for r in found.refusals]


@dataclass(frozen=True)
class Salvaged:
    """A value decoded with its refused parts set aside, and every refusal."""

    #: What decodes once the refused parts are set aside (their defaults in their place); None: nothing.
    value: Any | None
    refusals: list[Refusal]
    #: The indexes of the items taken out of each list (by the list's path in the value given).
    removed: dict[tuple[Segment, ...], list[int]] = dataclasses.field(default_factory=dict)

    def named(self, errors: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """The ``(field, message)`` errors of a check run on :attr:`value`, named as in the value given: an
        item after one taken out keeps its own index. An error about a refused field or inside one (the
        check saw its default), or about a list an item was taken out of (its count and repeats are not the
        list's), is left out: the refusal says what is wrong there."""
        shortened = {_dotted(list(path)) for path in self.removed}
        out = []
        for where, message in errors:
            path: list[Segment] = [int(part) if part.isdigit() else part for part in where.split(".")]
            original = _dotted(_original(path, self.removed))
            if original not in shortened and not any(_covers(r.field, original) for r in self.refusals):
                out.append((original, message))
        return out


def salvaged(raw: Any, target: Any, first: msgspec.ValidationError | None = None) -> Salvaged:
    """``raw`` as ``target``, every refusal found (``first``: msgspec's refusal of ``raw`` when the caller
    met it already; it alone is answered when the passes do not meet it again)."""
    if first is None:
        try:
            return Salvaged(msgspec.convert(raw, target, strict=True), [])
        except msgspec.ValidationError as exc:
            first = exc
    return _search(raw, target, first)


def _search(raw: Any, target: Any, first: msgspec.ValidationError) -> Salvaged:
    """The refusals, and the value decoded once they are set aside (None: nothing decodes)."""
    value = None
    data = copy.deepcopy(raw)
    removed: dict[tuple[Segment, ...], list[int]] = {}
    found: list[Refusal] = []
    for _ in range(MAX_REFUSALS * 2):  # a suppressed repeat takes a pass without a refusal
        try:
            value = msgspec.convert(data, target, strict=True)
            break
        except msgspec.ValidationError as exc:
            message, path = _split(str(exc))
        named = _NAMED.match(message)
        at = [*path, named.group(2)] if named else path
        original = _original(at, removed)
        where = _dotted(original)
        if not any(_covers(where, r.field) for r in found):
            found.append(Refusal(where, message, plain(message, target, original, raw)))
            if len(found) >= MAX_REFUSALS:
                break
        drop = at if named and named.group(1) == "contains unknown" else path
        if not _drop(data, drop, removed):
            break
    if not found:
        message, path = _split(str(first))
        found.append(Refusal(_dotted(path), message, plain(message, target, path, raw)))
    return Salvaged(value, found, removed)


def plain(message: str, target: Any, path: list[Segment], raw: Any) -> str:
    """msgspec's ``message`` about ``path`` of ``raw`` (decoded as ``target``), in plain words."""
    name = _name(path)
    declared: list[Any] = [target]
    node = _node_at(_info(target), path, raw, declared)
    if named := _NAMED.match(message):
        if named.group(1) == "missing required":
            return f"{named.group(2)} is required"
        parent = _node_at(_info(target), path[:-1], raw)
        fields = []
        if isinstance(parent, mi.StructType):
            fields = [parent.tag_field] if parent.tag_field else []
            fields += [f.encode_name for f in parent.fields]
        known = f"; the fields are {', '.join(fields)}" if fields else ""
        return f"{named.group(2)} is not a field here{known}"
    if invalid := _INVALID.match(message):
        values = _allowed(node, declared[-1])
        if values:
            return f"{name} is one of {', '.join(values)} (not {invalid.group(1)})"
        return f"{name}: {invalid.group(1)} is not allowed"
    if regex := _REGEX.match(message):
        meaning = next((v for k, v in PATTERNS.items() if message.endswith(f"regex {k!r}")), None)
        return f"{name} {meaning}" if meaning else f"{name} must match the pattern {regex.group(1)}"
    if _BOUND.match(message) and (bounds := _bounds(node)):
        return f"{name} {bounds}"
    if expected := _EXPECTED.match(message):
        want = " or ".join(_WORDS.get(t.strip(), t.strip()) for t in expected.group(1).split("|"))
        got = _GOT.get(expected.group(2)) or _WORDS.get(expected.group(2), expected.group(2))
        return f"{name} must be {want}, not {got}"
    if message.startswith("Invalid RFC3339") or "with a timezone" in message:
        return f"{name} must be an RFC 3339 time with its zone, such as 2025-03-01T14:00:00Z"
    if message == "Invalid UUID":
        return f"{name} must be a uuid"
    return f"{name}: {message}" if path else message


# --- paths -----------------------------------------------------------------------------------------------


def _split(text: str) -> tuple[str, list[Segment]]:
    """msgspec's message and the path it names (``$.steps[0].kind``: ``["steps", 0, "kind"]``)."""
    found = _AT.match(text)
    message, at = (found.group(1), found.group(2)) if found else (text, None)
    path: list[Segment] = []
    for key, index in _SEGMENT.findall((at or "$")[1:]):
        path.append(int(index) if index else key or "...")
    return message, path


def _dotted(path: list[Segment]) -> str:
    return ".".join(str(part) for part in path if part != "...")


def _join(prefix: str, field: str) -> str:
    return ".".join(part for part in (prefix, field) if part) or "body"


def _covers(where: str, field: str) -> bool:
    """An error at ``where`` says nothing new after one at ``field`` (the same field, or one inside it: a
    list too short once its bad item was set aside, an object missing the field just dropped)."""
    return field == where or field.startswith(where + ".") or (not where and bool(field))


def _name(path: list[Segment]) -> str:
    words = [part for part in path if isinstance(part, str) and part != "..."]
    if not words:
        return "the value"
    return f"each item of {words[-1]}" if isinstance(path[-1], int) else words[-1]


def _original(path: list[Segment], removed: dict[tuple[Segment, ...], list[int]]) -> list[Segment]:
    """A path in the data as it is now, in the data as given (items taken out shift later indexes)."""
    out: list[Segment] = []
    for part in path:
        if isinstance(part, int):
            for gone in sorted(removed.get(tuple(out), ())):
                if gone <= part:
                    part += 1
        out.append(part)
    return out


def _drop(data: Any, path: list[Segment], removed: dict[tuple[Segment, ...], list[int]]) -> bool:
    """Set the value at ``path`` aside (False: it is the whole value, nothing is left to decode)."""
    while path and path[-1] == "...":  # a value of a mapping, its key unnamed: the mapping goes
        path = path[:-1]
    if not path:
        return False
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if isinstance(last, int) and isinstance(parent, list):
        gone = _original(path, removed)[-1]
        assert isinstance(gone, int)
        removed.setdefault(tuple(_original(path[:-1], removed)), []).append(gone)
        del parent[last]
    elif isinstance(parent, dict) and last in parent:
        del parent[last]
    else:
        return _drop(data, path[:-1], removed)
    return True


# --- the type at a path ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _cached_info(target: Any) -> mi.Type:
    return mi.type_info(target)


def _info(target: Any) -> mi.Type:
    try:
        return _cached_info(target)
    except TypeError:  # an unhashable type
        return mi.type_info(target)


def _node_at(
    node: mi.Type | None, path: list[Segment], raw: Any, declared: list[Any] | None = None
) -> mi.Type | None:
    """The type of the value at ``path`` (a union of tagged structs resolved by the tag ``raw`` has);
    ``declared`` gains the annotation of each struct field on the way, as the code declares it."""
    value = raw
    for part in path:
        node = _unwrap(node, value, part)
        if isinstance(node, mi.LiteralType):  # the tag of a tagged union
            return node
        if isinstance(part, int) or part == "...":
            node = getattr(node, "item_type", None) or getattr(node, "value_type", None)
            value = (
                value[part]
                if isinstance(value, list) and isinstance(part, int) and part < len(value)
                else None
            )
        elif isinstance(node, mi.StructType):
            field = next((f for f in node.fields if f.encode_name == part), None)
            if field is not None and declared is not None:
                declared.append(
                    next(f.type for f in msgspec.structs.fields(node.cls) if f.name == field.name)
                )
            node = field.type if field is not None else None
            value = value.get(part) if isinstance(value, dict) else None
        elif isinstance(node, mi.DictType):
            node, value = node.value_type, value.get(part) if isinstance(value, dict) else None
        else:
            return None
    return _unwrap(node, value, None)


def _unwrap(node: mi.Type | None, value: Any, part: Segment | None) -> mi.Type | None:
    """``node`` without its metadata and ``None`` option; a union of tagged structs as the struct
    ``value``'s tag names, or as the tag itself when ``part`` is the tag's field."""
    while isinstance(node, mi.Metadata):
        node = node.type
    if not isinstance(node, mi.UnionType):
        return node
    types = [t for t in node.types if not isinstance(t, mi.NoneType)]
    structs = [t for t in types if isinstance(t, mi.StructType)]
    if structs and structs[0].tag_field is not None:
        if part == structs[0].tag_field:
            return mi.LiteralType(tuple(str(s.tag) for s in structs))
        tag = value.get(structs[0].tag_field) if isinstance(value, dict) else None
        return next((s for s in structs if s.tag == tag), structs[0])
    return _unwrap(types[0], value, part) if len(types) == 1 else (structs or types)[0]


def _allowed(node: mi.Type | None, declared: Any) -> list[str]:
    """The values ``node`` allows, in the order the code declares them (``declared``: the annotation the
    node is part of; msgspec's inspection sorts a Literal's values)."""
    if isinstance(node, mi.LiteralType):
        return [str(v) for v in _declared_order(declared, node.values)]
    if isinstance(node, mi.EnumType):
        return [str(member.value) for member in node.cls]
    return []


def _declared_order(annotation: Any, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` in the order of the ``Literal`` of ``annotation`` that holds exactly them (``values`` as
    they are when none does, as for the tags of a tagged union, already in the union's order)."""
    if typing.get_origin(annotation) is Literal:
        args = typing.get_args(annotation)
        return args if set(args) == set(values) else values
    for arg in typing.get_args(annotation):
        found = _declared_order(arg, values)
        if found is not values:
            return found
    return values


def _bounds(node: mi.Type | None) -> str | None:
    """The bounds of a number, a text or a list, in words."""
    if isinstance(node, (mi.IntType, mi.FloatType)):
        what = "a whole number" if isinstance(node, mi.IntType) else "a number"
        low = node.ge if node.ge is not None else node.gt
        high = node.le if node.le is not None else node.lt
        if low is not None and high is not None:
            return f"must be {what} from {low} to {high}"
        if low is not None:
            return f"must be {what} {'of at least' if node.ge is not None else 'above'} {low}"
        if high is not None:
            return f"must be {what} {'of at most' if node.le is not None else 'below'} {high}"
        return None
    unit = "characters" if isinstance(node, mi.StrType) else "items"
    low, high = getattr(node, "min_length", None), getattr(node, "max_length", None)
    if low is not None and high is not None:
        return f"must have {low} to {high} {unit}"
    if high is not None:
        return f"must have at most {high} {unit}"
    if low is not None:
        return f"must have at least {low} {unit}"
    return None
