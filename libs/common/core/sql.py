"""Named SQL: queries live in ``.sql`` files next to the code that uses them.

A file holds blocks headed ``-- name: <query_name>`` followed by a one-line ``-- <description>``, then
the statement with ``%(param)s`` placeholders. :func:`load_queries` parses a file once into a mapping
from name to statement; domain code asks for ``QUERIES["claim_due_enrollment"]``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from operator import itemgetter
from typing import Any, LiteralString, NamedTuple

_HEADER = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, LiteralString]:
    """Split a named-SQL file into ``{name: statement}``."""
    parts = _HEADER.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        lines = body.strip("\n").splitlines()
        if not lines or not lines[0].startswith("-- ") or not lines[0][3:].strip():
            raise ValueError(f"query {name!r} has no one-line description (a `-- ...` line after its name)")
        # without its comment lines and indentation: shorter to send, and within psycopg's cache of converted
        # statements (4,096 characters; a longer one is parsed again at every execution)
        statement = "\n".join(
            line.strip() for line in lines if line.strip() and not line.lstrip().startswith("--")
        )
        if not statement:
            raise ValueError(f"query {name!r} has no statement")
        queries[name] = statement
    return queries


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, LiteralString]:
    """Load the named queries of ``filename`` inside ``package`` (call once, at import)."""
    return parse_queries(resources.files(package).joinpath(filename).read_text(encoding="utf-8"))


_ANY_OF_IDS = re.compile(r"= ANY\(%\(ids\)s(?:::\w+\[\])?\)")


def of_one(statement: LiteralString, one: LiteralString = "id") -> LiteralString:
    """``statement``, written for an array of ids (``= ANY(%(ids)s)``), for one id (``= %(<one>)s``), for a
    caller that always has one. A prepared statement is planned again at every execution when its generic
    plan is estimated dearer than the plans for its values: an array parameter is estimated at ten rows,
    one id at one row, so the array's form is never kept for one id (the database's CPU at every
    execution, in a hot path). The form for one id is planned once per connection."""
    written, found = _ANY_OF_IDS.subn(f"= %({one})s", statement)
    if found != 1:
        raise ValueError(f"one '= ANY(%(ids)s)' expected, {found} found in: {statement}")
    return written


class OverIds(NamedTuple):
    """A statement over ``%(ids)s`` (``= ANY(%(ids)s)``) in both forms: for any number of ids, and for one
    (:func:`of_one`). The common case (a contact's one live enrollment, its one queued message) then runs
    the form PostgreSQL plans once per connection."""

    many: LiteralString
    one: LiteralString

    @classmethod
    def of(cls, statement: LiteralString) -> OverIds:
        return cls(statement, of_one(statement))

    def bound(self, params: dict[str, Any], ids: Sequence[Any]) -> tuple[LiteralString, dict[str, Any]]:
        """The form for ``ids`` and ``params`` with them (``id`` for one, ``ids`` for any other number)."""
        if len(ids) == 1:
            return self.one, params | {"id": ids[0]}
        return self.many, params | {"ids": list(ids)}


def with_parts(statement: LiteralString, **parts: LiteralString) -> LiteralString:
    """``statement`` with ``parts`` (data-modifying statements of other modules, by name) run in its own
    execution as common table expressions: one statement where there were several, each part still written
    by the module that owns its table. A part runs whether or not the statement reads it (PostgreSQL runs a
    data-modifying ``WITH`` to completion once); every part sees the snapshot the statement started with,
    so no part may depend on another's rows. Their parameters share one namespace: the same name is the
    same value. A part that has common table expressions of its own (``WITH a AS (...) ...``) brings them
    up beside it (PostgreSQL allows a data-modifying ``WITH`` only at the top): their names must differ
    from the others'."""
    assert parts and not statement.startswith("WITH RECURSIVE"), statement
    ctes: list[str] = []
    for name, part in parts.items():
        own, body = _split_with(part)
        ctes += [*own, f"{name} AS (\n{body}\n)"]
    names = [cte.split(" AS (", 1)[0] for cte in [*ctes, *_split_with(statement)[0]]]
    assert len(names) == len(set(names)), f"a name used twice: {names}"
    joined = ",\n".join(ctes)
    if statement.startswith("WITH "):
        return f"WITH {joined},\n{statement.removeprefix('WITH ')}"
    return f"WITH {joined}\n{statement}"


def _split_with(statement: str) -> tuple[list[str], str]:
    """A statement's common table expressions (each ``name AS (...)``) and what follows them; none when it
    does not start with ``WITH``. Parentheses inside quoted text are not counted."""
    if not statement.startswith("WITH "):
        return [], statement
    ctes, depth, quoted, start = [], 0, False, len("WITH ")
    for i, char in enumerate(statement):
        if char == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                ctes.append(statement[start : i + 1].strip())
                rest = statement[i + 1 :].lstrip()
                if not rest.startswith(","):
                    return ctes, rest
                start = len(statement) - len(rest) + 1
    raise ValueError(f"a WITH without its statement: {statement}")


class Numbered(NamedTuple):
    """A statement whose ``%(name)s`` placeholders were numbered once (``$1``, ``$2``, ...: the server's own),
    for a raw cursor (:class:`psycopg.RawCursor`, values by position): psycopg then converts nothing at each
    execution, where it parses a statement longer than 4,096 characters again every time."""

    text: LiteralString
    names: tuple[str, ...]
    #: The statement as written (with its ``%(name)s`` placeholders).
    named: LiteralString

    def values(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """``params`` (by name) in the statement's order."""
        return _getter(self.names)(params)


@cache
def _getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """Picks ``names``' values out of a mapping, in order, as a tuple (one lookup in C, not one per name)."""
    if len(names) < 2:  # itemgetter's own result for one name is the value, not a tuple
        return lambda params: tuple(params[name] for name in names)
    return itemgetter(*names)


_NAMED = re.compile(r"%\((\w+)\)s|%%")


def numbered(statement: LiteralString) -> Numbered:
    """``statement`` with one number per placeholder name (``%%``, psycopg's escaped ``%``, back to ``%``)."""
    assert "%(" not in _NAMED.sub("", statement), "only %(name)s placeholders can be numbered"
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    return Numbered(_NAMED.sub(number, statement), tuple(names), statement)
