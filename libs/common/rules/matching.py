"""Matching: a rule's compiled conditions (:func:`~libs.common.platform.conditions.compile_conditions`)
written into SQL text with their values (:func:`inline`), and those predicates evaluated over triggers
(:func:`match`), as the triggers service and the delayed-rule sweep do, or node by node with the values
they compare (:func:`evaluate`), as a trace does.

A statement binds only the project and its triggers' ids, whatever the number of leaves (PostgreSQL binds at
most 65,535 parameters); its text stays the same while the rules do, so it is prepared once per connection.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import ClientCursor, Connection, RawCursor, sql
from psycopg.types.numeric import FloatDumper

from libs.common.platform.conditions import EVENT_CONTEXT

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


def matching_statement(predicates: list[str]) -> str:
    """The statement that evaluates ``predicates`` over a project's triggers (``$1``: the project, ``$2``:
    the triggers' ids)."""
    columns = ", ".join(predicates)
    return f"SELECT t.id, ARRAY[{columns}] FROM {_CONTEXT} WHERE t.project_id = $1 AND t.id = ANY($2)"


def match(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[int], predicates: list[str]
) -> dict[int, list[bool]]:
    """Each predicate (a rule's conditions with their values written in: :attr:`ActiveRule.literal`) over
    each trigger of ``ids`` (of the project, and one event), in order; a trigger whose contact is gone is
    left out. A statement binds only the project and the triggers' ids, whatever the number of leaves
    (PostgreSQL binds at most 65,535 parameters), and its text stays the same while the rules do, so it is
    prepared once per connection instead of parsed and planned on every batch."""
    return matched(ids, send_match(conn, project_id, ids, predicates))


def send_match(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[int], predicates: list[str]
) -> list[RawCursor[Any]]:
    """:func:`match`'s statements sent, each on a cursor of its own: in pipeline mode they are queued with
    the caller's statements (one round trip for all); :func:`matched` reads them."""
    cursors = []
    for chunk in _chunks(predicates) if predicates else []:
        cur = RawCursor(conn)
        cur.execute(matching_statement(chunk).encode(), [project_id, ids], prepare=True)
        cursors.append(cur)
    return cursors


def matched(ids: list[int], cursors: list[RawCursor[Any]]) -> dict[int, list[bool]]:
    """What the statements :func:`send_match` sent for ``ids`` found (see :func:`match`); closes them."""
    if not cursors:
        return {}
    results: dict[int, list[bool]] = {i: [] for i in ids}
    for cur in cursors:
        with cur:
            found = dict(cur.fetchall())
        for trigger_id in list(results):
            if trigger_id in found:
                results[trigger_id] += found[trigger_id]
            else:
                del results[trigger_id]  # the contact is gone: no rule matches
    return results


def evaluation_statement(predicates: list[str], values: list[str]) -> str:
    """The statement that evaluates ``predicates`` and ``values`` over some of a project's triggers (``$1``:
    the project, ``$2``: the triggers' ids)."""
    results = f"ARRAY[{', '.join(predicates)}]::boolean[]"
    found = f"ARRAY[{', '.join(values)}]::jsonb[]"
    return f"SELECT t.id, {results}, {found} FROM {_CONTEXT} WHERE t.project_id = $1 AND t.id = ANY($2)"


def evaluate(
    conn: Connection[Any],
    project_id: uuid.UUID,
    trigger_ids: list[int],
    predicates: list[str],
    values: list[str],
) -> dict[int, tuple[list[bool], list[Any]]]:
    """Each predicate (written in: :func:`inline`) and each value (a jsonb expression written in the same
    way) over each of the project's triggers ``trigger_ids``, in ONE statement, as a trace reads a rule
    (:mod:`~libs.common.rules.trace`); a trigger whose contact is gone is left out. The statement is made
    for the rule as it is (not prepared: a project's many rules would push the matching statements out of
    the connection's prepared ones)."""
    query = evaluation_statement(predicates, values)
    with RawCursor(conn) as cur:
        rows = cur.execute(query.encode(), [project_id, trigger_ids], prepare=False).fetchall()
    return {trigger_id: (list(results), list(actuals)) for trigger_id, results, actuals in rows}


def _chunks(predicates: list[str]) -> list[list[str]]:
    """The predicates in order, in chunks whose text stays under :data:`MAX_STATEMENT_CHARS`."""
    chunks: list[list[str]] = [[]]
    size = 0
    for predicate in predicates:
        if chunks[-1] and size + len(predicate) > MAX_STATEMENT_CHARS:
            chunks.append([])
            size = 0
        chunks[-1].append(predicate)
        size += len(predicate)
    return chunks
