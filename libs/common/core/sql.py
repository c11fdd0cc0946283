"""Named SQL: queries live in ``.sql`` files next to the code that uses them.

A file holds blocks headed ``-- name: <query_name>`` followed by a one-line ``-- <description>``, then
the statement with ``%(param)s`` placeholders. :func:`load_queries` parses a file once into a mapping
from name to statement; domain code asks for ``QUERIES["claim_due_enrollment"]``.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

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
