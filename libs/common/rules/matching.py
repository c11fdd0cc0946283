"""Matching: a rule's compiled conditions (:func:`~libs.common.platform.conditions.compile_conditions`)
written into SQL text with their values (:func:`inline`), and those predicates evaluated over triggers
(:func:`match`; the triggers service's columns also carry the trace of each rule that holds), or node by
node with the values they compare (:func:`evaluate`), as a trace read apart does (a dry run's, the sweep's).

A statement binds only the project and its triggers' ids, whatever the number of leaves (PostgreSQL binds at
most 65,535 parameters); its text stays the same while the rules do, so it is prepared once per connection.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any, TypeVar

from psycopg import ClientCursor, Connection, RawCursor, sql
from psycopg.types.numeric import FloatDumper

from libs.common.platform.conditions import EVENT_CONTEXT

T = TypeVar("T")

#: FROM clause of the context a rule's predicate is evaluated over: the trigger ``t`` (selected by the caller;
#: the event's own message and ``changed`` set live in its payload) and its event's context.
CONTEXT = sql.SQL("followup_triggers t\n{}").format(EVENT_CONTEXT)


class _Float8Literal(FloatDumper):
    """A float written into a statement as a float8 literal (psycopg writes a bare ``1.5``, a numeric),
    so an inlined value compares exactly as the bound parameter does."""

    def quote(self, obj: Any) -> bytes:
        return b"'" + bytes(self.dump(obj) or b"") + b"'::float8"


def inline(conn: Connection[Any], predicate: sql.Composable, params: list[Any]) -> str:
    """A compiled predicate with its parameters written in as literals (psycopg's client-side quoting, the
    connection's encoding): a statement that binds nothing, whatever the number of leaves, and whose text
    stays the same while the rule does, so the server parses and plans it once per connection (prepared)."""
    cursor = ClientCursor(conn)
    cursor.adapters.register_dumper(float, _Float8Literal)
    return cursor.mogrify(sql.Composed([predicate]), params)


#: The FROM clause the rules' predicates are written over, as text.
_CONTEXT = CONTEXT.as_string()
#: Longest text of one matching statement (its rules' predicates with their values written in): a project's
#: rules are matched in as many statements as keep each under it, so a change of one rule makes the server
#: parse and plan again only the statement that holds it.
MAX_STATEMENT_CHARS = 256 * 1024


def matching_statement(columns: list[str]) -> str:
    """The statement that evaluates ``columns`` (the rules' predicates, or their traced columns:
    :class:`~libs.common.rules.trace.TracedMatch`) over a project's triggers (``$1``: the project, ``$2``:
    the triggers' ids), as an array."""
    return (
        f"SELECT t.id, ARRAY[{', '.join(columns)}] FROM {_CONTEXT} WHERE t.project_id = $1 AND t.id = ANY($2)"
    )


#: How many matching statements a process keeps written out (each a project's rules for one event, up to
#: :data:`MAX_STATEMENT_CHARS`, a few kilobytes for most): a statement kept is not joined, encoded and hashed
#: again at every batch (a hundred kilobytes for a project of many rules); one not kept is made again, the
#: same. At most 64 MB should every one kept be of the longest.
KEPT_STATEMENTS = 256


@functools.lru_cache(maxsize=KEPT_STATEMENTS)
def _matching_bytes(columns: tuple[str, ...]) -> bytes:
    """:func:`matching_statement` of ``columns``, encoded, kept for the next batch of the same rules (the
    columns are the cached rules' own strings: the key hashes and compares by them)."""
    return matching_statement(list(columns)).encode()


def match(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[int], predicates: list[str]
) -> dict[int, list[bool]]:
    """Each predicate (a rule's conditions with their values written in: :func:`inline`) over each trigger
    of ``ids`` (of the project, and one event), in order; a trigger whose contact is gone is left out. The
    triggers service matches with traced columns instead (:class:`~libs.common.rules.trace.TracedMatch`).
    A statement binds only the project and the triggers' ids, whatever the number of leaves
    (PostgreSQL binds at most 65,535 parameters), and its text stays the same while the rules do, so it is
    prepared once per connection instead of parsed and planned on every batch."""
    return matched(ids, send_match(conn, project_id, ids, predicates))


def send_match(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[int], columns: list[str]
) -> list[RawCursor[Any]]:
    """:func:`match`'s statements sent, each on a cursor of its own: in pipeline mode they are queued with
    the caller's statements (one round trip for all); :func:`matched` reads them. ``columns``: the rules'
    predicates, or their traced columns (the triggers service's,
    :class:`~libs.common.rules.trace.TracedMatch`: NULL where a rule does not hold)."""
    cursors = []
    for chunk in _chunks([(c, len(c)) for c in columns]) if columns else []:
        cur = RawCursor(conn)
        cur.execute(_matching_bytes(tuple(p for p, _ in chunk)), [project_id, ids], prepare=True)
        cursors.append(cur)
    return cursors


def matched(ids: list[int], cursors: list[RawCursor[Any]]) -> dict[int, list[Any]]:
    """What the statements :func:`send_match` sent for ``ids`` found, each column's value by trigger (see
    :func:`match`); closes them."""
    if not cursors:
        return {}
    results: dict[int, list[Any]] = {i: [] for i in ids}
    for cur in cursors:
        with cur:
            found = dict(cur.fetchall())
        for trigger_id in list(results):
            if trigger_id in found:
                results[trigger_id] += found[trigger_id]
            else:
                del results[trigger_id]  # the contact is gone: no rule matches
    return results


#: What a trace evaluates for one rule: its nodes' predicates and its leaves' values (written in:
#: :func:`inline`), and the triggers to evaluate them over.
Evaluation = tuple[list[str], list[str], list[int]]


def evaluation_statement(rules: list[tuple[list[str], list[str]]]) -> str:
    """The statement that evaluates each rule's ``predicates`` and ``values`` over some of a project's
    triggers (``$1``: the project, ``$2``: every trigger's id; ``$3``, ``$4``, ...: each rule's triggers,
    over which alone its arrays are computed, NULL for the others)."""
    columns = []
    for k, (predicates, values) in enumerate(rules, start=3):
        columns.append(f"CASE WHEN t.id = ANY(${k}) THEN ARRAY[{', '.join(predicates)}]::boolean[] END")
        columns.append(f"CASE WHEN t.id = ANY(${k}) THEN ARRAY[{', '.join(values)}]::jsonb[] END")
    return f"SELECT t.id, {', '.join(columns)} FROM {_CONTEXT} WHERE t.project_id = $1 AND t.id = ANY($2)"


def evaluate(
    conn: Connection[Any], project_id: uuid.UUID, rules: list[Evaluation]
) -> list[dict[int, tuple[list[bool], list[Any]]]]:
    """Each rule's predicates and values (as a trace reads a rule: :mod:`~libs.common.rules.trace`) over
    its triggers of the project, by trigger, in the rules' order; a trigger whose contact is gone is left
    out. The rules go together: one statement (and one read of each trigger's context) for as many as keep
    its text under :data:`MAX_STATEMENT_CHARS`. The statement is made for the rules as they are (not
    prepared: which rules a batch traces changes, and a project's many rules would push the matching
    statements out of the connection's prepared ones)."""
    found: list[dict[int, tuple[list[bool], list[Any]]]] = []
    if not rules:
        return found
    sizes = [sum(map(len, predicates)) + sum(map(len, values)) for predicates, values, _ in rules]
    for chunk in _chunks(list(zip(rules, sizes, strict=True))):
        ids = sorted({i for (_, _, trigger_ids), _ in chunk for i in trigger_ids})
        query = evaluation_statement([(predicates, values) for (predicates, values, _), _ in chunk])
        params: list[Any] = [project_id, ids] + [trigger_ids for (_, _, trigger_ids), _ in chunk]
        with RawCursor(conn) as cur:
            rows = cur.execute(query.encode(), params, prepare=False).fetchall()
        for k in range(len(chunk)):
            results, actuals = 1 + 2 * k, 2 + 2 * k
            found.append({row[0]: (row[results], row[actuals]) for row in rows if row[results] is not None})
    return found


def _chunks(items: list[tuple[T, int]]) -> list[list[tuple[T, int]]]:
    """The items (each with the length of its text) in order, in chunks whose text stays under
    :data:`MAX_STATEMENT_CHARS`."""
    chunks: list[list[tuple[T, int]]] = [[]]
    size = 0
    for item in items:
        if chunks[-1] and size + item[1] > MAX_STATEMENT_CHARS:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += item[1]
    return chunks
