"""Rule conditions: the ONE SQL predicate a tree compiles to agrees with a plain-Python reading of the
documented semantics, over random trees and random contexts stored as real rows; no user value (custom
attribute keys included) ever reaches the SQL text; invalid trees are rejected naming the JSON path.

The evaluator below is written from what ``libs.common.rules.conditions`` documents (its docstring and the
catalogue's descriptions), not from its SQL:

* text ignores ASCII case only (A-Z fold to a-z, every other letter compares as written);
* a leaf about an absent value is false, and a negative operator is NOT of its positive one;
* a list (contact.tags, conversation.labels) matches when any item equals the value (``in``: any item is in
  the list); it is present when it has items;
* ``contact.attributes.<key>`` compares as the JSON type of the condition's value (string, number, boolean)
  and only matches a stored value of that same type; it is present unless missing, JSON null or "";
* ``changed`` is the set of keys of the payload's ``changed`` object (compared as written);
  ``attribute_changed`` compares the payload's ``changed -> attribute -> from / to`` as JSON values;
* the lead (deal) is the event's own (payload ``lead_id`` / ``deal_id``) when it is the contact's, else the
  contact's newest by created_at (deal: updated_at), then lowest id.
"""

from __future__ import annotations

import json
import math
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import cache, partial
from typing import Any, LiteralString

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from psycopg import Connection, sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.core.errors import InvalidInput
from libs.common.rules.conditions import (
    ALWAYS,
    ATTRIBUTES,
    CONTEXT,
    CUSTOM_PREFIX,
    MAX_DEPTH,
    MAX_LEAVES,
    MAX_LIST,
    MAX_TEXT,
    Group,
    Leaf,
    Node,
    compile_conditions,
    parse_conditions,
)
from tests.conftest import Project

T0 = datetime(2030, 1, 1, tzinfo=UTC)

# --- the evaluator: the documented semantics in plain Python -----------------------------------------------

#: Each catalogue attribute's kind, as the module's documentation describes it.
KINDS = {
    "contact.name": "text",
    "contact.phone": "text",
    "contact.timezone": "text",
    "contact.consent": "text",
    "contact.opted_out": "bool",
    "contact.tags": "list",
    "conversation.status": "text",
    "conversation.priority": "text",
    "conversation.labels": "list",
    "conversation.assignee": "text",
    "conversation.team": "text",
    "conversation.inbox": "text",
    "conversation.number": "text",
    "message.type": "text",
    "message.content": "text",
    "lead.status": "text",
    "deal.stage": "text",
    "changed": "changed",
}
NEGATIVE = {
    "not_equal_to": "equal_to",
    "does_not_contain": "contains",
    "not_in": "in",
    "is_not_present": "is_present",
}
ASCII_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

#: Fixed ids, so that trees drawn before the rows exist can name them (rolled back after each example).
NUMBER_IDS = (
    uuid.UUID("0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"),
    uuid.UUID("fedcba98-7654-4321-8fed-cba987654321"),
)
LEAD_IDS = (
    uuid.UUID("c0000000-0000-4000-8000-000000000001"),
    uuid.UUID("a0000000-0000-4000-8000-000000000002"),
    uuid.UUID("b0000000-0000-4000-8000-000000000003"),
)
DEAL_IDS = (
    uuid.UUID("b1000000-0000-4000-8000-000000000001"),
    uuid.UUID("c1000000-0000-4000-8000-000000000002"),
    uuid.UUID("a1000000-0000-4000-8000-000000000003"),
)
#: Another contact's lead and deal (the newest of all), and an id no row has.
FOREIGN_LEAD_ID = uuid.UUID("f0000000-0000-4000-8000-00000000000f")
FOREIGN_DEAL_ID = uuid.UUID("f1000000-0000-4000-8000-00000000000f")
UNKNOWN_ID = uuid.UUID("e0000000-0000-4000-8000-00000000000e")
REFS = {"foreign": (FOREIGN_LEAD_ID, FOREIGN_DEAL_ID), "unknown": (UNKNOWN_ID, UNKNOWN_ID)}


@dataclass(frozen=True)
class Conversation:
    status: str
    priority: str | None
    assignee: str | None
    team: str | None
    inbox: str | None
    number: int | None  # index into NUMBER_IDS
    labels: list[str | None]


@dataclass(frozen=True)
class Context:
    """One trigger's context: the rows ``store`` writes, read by ``holds``."""

    name: str | None
    phone: str | None
    timezone: str | None
    consent: str
    opted_out: bool
    tags: list[str | None]
    attributes: dict[str, Any]
    conversation: Conversation | None
    leads: list[tuple[str, int]]  # (status, minutes after T0 it was created), ids from LEAD_IDS
    deals: list[tuple[str, int]]  # (stage, minutes after T0 it was updated), ids from DEAL_IDS
    lead_ref: str | int  # the payload's lead_id: "absent", "null", "foreign", "unknown" or an index
    deal_ref: str | int
    message: dict[str, Any] | None  # None: the payload has no message
    changed: dict[str, Any] | None  # None: the payload has no changed object

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.message is not None:
            out["message"] = self.message
        if self.changed is not None:
            out["changed"] = self.changed
        for key, ref, ids, slot in (
            ("lead_id", self.lead_ref, LEAD_IDS, 0),
            ("deal_id", self.deal_ref, DEAL_IDS, 1),
        ):
            if ref != "absent":
                out[key] = None if ref == "null" else str(_ref_id(ref, ids, slot))
        return out


def _ref_id(ref: str | int, ids: tuple[uuid.UUID, ...], slot: int) -> uuid.UUID | None:
    if isinstance(ref, int):
        return ids[ref]
    return REFS[ref][slot] if ref in REFS else None


def fold(text: str) -> str:
    return text.translate(ASCII_FOLD)


def json_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return None


def number(value: int | float) -> Decimal:
    return Decimal(repr(value))


def json_equal(a: Any, b: Any) -> bool:
    """jsonb equality: numbers by value (1 = 1.0), strings as written, arrays item by item."""
    if a is None or b is None:
        return a is None and b is None
    kind = json_kind(a)
    if kind != json_kind(b):
        return False
    if kind == "number":
        return number(a) == number(b)
    if kind is not None:
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return False


def chosen(rows: list[tuple[uuid.UUID, str, int]], wanted: uuid.UUID | None) -> str | None:
    """The event's own row when the contact has it, else the newest, then the lowest id."""
    for row_id, value, _ in rows:
        if row_id == wanted:
            return value
    ordered = sorted(rows, key=lambda row: (-row[2], row[0]))
    return ordered[0][1] if ordered else None


def attribute_value(ctx: Context, name: str) -> Any:
    """A catalogue attribute's value over the context (None: absent)."""
    contact = {
        "contact.name": ctx.name,
        "contact.phone": ctx.phone,
        "contact.timezone": ctx.timezone,
        "contact.consent": ctx.consent,
        "contact.opted_out": ctx.opted_out,
        "contact.tags": ctx.tags,
        "changed": ctx.changed,
    }
    if name in contact:
        return contact[name]
    if name.startswith("conversation."):
        v = ctx.conversation
        if v is None:
            return None
        return {
            "conversation.status": v.status,
            "conversation.priority": v.priority,
            "conversation.labels": v.labels,
            "conversation.assignee": v.assignee,
            "conversation.team": v.team,
            "conversation.inbox": v.inbox,
            "conversation.number": None if v.number is None else str(NUMBER_IDS[v.number]),
        }[name]
    if name.startswith("message."):
        return (ctx.message or {}).get(name.removeprefix("message."))
    if name == "lead.status":
        rows = [(LEAD_IDS[i], status, at) for i, (status, at) in enumerate(ctx.leads)]
        return chosen(rows, _ref_id(ctx.lead_ref, LEAD_IDS, 0))
    assert name == "deal.stage", name
    rows = [(DEAL_IDS[i], stage, at) for i, (stage, at) in enumerate(ctx.deals)]
    return chosen(rows, _ref_id(ctx.deal_ref, DEAL_IDS, 1))


def compare(kind: str, value: Any, operator: str, wanted: Any) -> bool:
    """A positive operator over a value of ``kind`` (None: absent, so false)."""
    if operator == "is_present":
        if kind == "text":
            return value is not None and value != ""
        if kind == "list":
            return value is not None and len(value) > 0
        return value is not None
    if value is None:
        return False
    if kind == "bool":
        assert operator == "equal_to"
        return bool(value == wanted)
    if kind == "number":
        if operator == "in":
            return number(value) in [number(w) for w in wanted]
        return {
            "equal_to": number(value) == number(wanted),
            "is_greater_than": number(value) > number(wanted),
            "is_less_than": number(value) < number(wanted),
        }[operator]
    if kind == "list":
        items = {fold(item) for item in value if item is not None}
        if operator == "in":
            return any(fold(w) in items for w in wanted)
        return fold(wanted) in items  # equal_to and contains alike
    text = fold(value)
    if operator == "in":
        return text in {fold(w) for w in wanted}
    return {
        "equal_to": text == fold(wanted),
        "contains": fold(wanted) in text,
        "starts_with": text.startswith(fold(wanted)),
    }[operator]


def leaf_holds(attribute: str, operator: str, wanted: Any, ctx: Context) -> bool:
    if operator == "attribute_changed":
        changed = ctx.changed or {}
        if attribute not in changed:
            return False
        change = changed[attribute]
        return all(
            isinstance(change, dict) and end in change and json_equal(change[end], wanted[end])
            for end in ("from", "to")
            if end in wanted
        )
    if attribute.startswith(CUSTOM_PREFIX):
        stored = ctx.attributes.get(attribute.removeprefix(CUSTOM_PREFIX))
        if operator == "is_present":
            return stored is not None and stored != ""
        kind = json_kind(wanted[0] if isinstance(wanted, list) else wanted)
        assert kind is not None
        return compare(kind, stored if json_kind(stored) == kind else None, operator, wanted)
    kind = KINDS[attribute]
    value = attribute_value(ctx, attribute)
    if kind == "changed":
        if operator == "is_present":
            return bool(value)
        return value is not None and wanted in value
    return compare(kind, value, operator, wanted)


def holds(node: Node, ctx: Context) -> bool:
    if isinstance(node, Group):
        results = [holds(child, ctx) for child in node.children]
        return all(results) if node.kind == "all" else any(results)
    if node.operator in NEGATIVE:
        return not leaf_holds(node.attribute, NEGATIVE[node.operator], node.value, ctx)
    return leaf_holds(node.attribute, node.operator, node.value, ctx)


# --- the rows ----------------------------------------------------------------------------------------------


def _one(conn: Connection[Any], query: LiteralString, params: tuple[Any, ...]) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def store(conn: Connection[Any], project_id: uuid.UUID, ctx: Context) -> int:
    """``ctx`` as rows (with another contact's lead and deal, the newest of all): the trigger's id."""
    for i, number_id in enumerate(NUMBER_IDS):
        conn.execute(
            "INSERT INTO numbers (id, project_id, phone) VALUES (%s, %s, %s)",
            (number_id, project_id, f"+1999000000{i}"),
        )
    contact_id = _one(
        conn,
        "INSERT INTO contacts (project_id, phone, name, timezone, attributes, tags, opted_out_at, consent)"
        " VALUES (%s, %s, %s, %s, %s, %s::text[], %s, %s) RETURNING id",
        (
            project_id,
            ctx.phone,
            ctx.name,
            ctx.timezone,
            Jsonb(ctx.attributes),
            ctx.tags,
            T0 if ctx.opted_out else None,
            ctx.consent,
        ),
    )
    other_id = _one(conn, "INSERT INTO contacts (project_id) VALUES (%s) RETURNING id", (project_id,))
    newest = T0 + timedelta(days=1)
    conn.execute(
        "INSERT INTO leads (id, project_id, contact_id, status, created_at)"
        " VALUES (%s, %s, %s, 'foreign', %s)",
        (FOREIGN_LEAD_ID, project_id, other_id, newest),
    )
    conn.execute(
        "INSERT INTO deals (id, project_id, contact_id, stage, created_at, updated_at)"
        " VALUES (%s, %s, %s, 'foreign', %s, %s)",
        (FOREIGN_DEAL_ID, project_id, other_id, newest, newest),
    )
    for i, (status, minutes) in enumerate(ctx.leads):
        conn.execute(
            "INSERT INTO leads (id, project_id, contact_id, status, created_at) VALUES (%s, %s, %s, %s, %s)",
            (LEAD_IDS[i], project_id, contact_id, status, T0 + timedelta(minutes=minutes)),
        )
    for i, (stage, minutes) in enumerate(ctx.deals):
        # created_at goes the other way: the newest deal is the one updated last
        conn.execute(
            "INSERT INTO deals (id, project_id, contact_id, stage, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (
                DEAL_IDS[i],
                project_id,
                contact_id,
                stage,
                T0 - timedelta(minutes=minutes),
                T0 + timedelta(minutes=minutes),
            ),
        )
    conversation_id = None
    v = ctx.conversation
    if v is not None:
        conversation_id = _one(
            conn,
            "INSERT INTO conversations (project_id, contact_id, number_id, status, priority, assignee, team,"
            " inbox_thread, labels) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::text[]) RETURNING id",
            (
                project_id,
                contact_id,
                None if v.number is None else NUMBER_IDS[v.number],
                v.status,
                v.priority,
                v.assignee,
                v.team,
                v.inbox,
                v.labels,
            ),
        )
    trigger_id: int = _one(
        conn,
        "INSERT INTO followup_triggers (project_id, type, contact_id, conversation_id, payload, occurred_at,"
        " next_attempt_at) VALUES (%s, 'message.received', %s, %s, %s, %s, %s) RETURNING id",
        (project_id, contact_id, conversation_id, Jsonb(ctx.payload()), T0, T0),
    )
    return trigger_id


def evaluate(conn: Connection[Any], nodes: list[Node], trigger_id: int) -> list[Any]:
    """Every tree's predicate over the trigger's context, in ONE query."""
    predicates: list[sql.Composable] = []
    params: list[Any] = []
    for node in nodes:
        predicate, node_params = compile_conditions(node)
        predicates.append(predicate)
        params.extend(node_params)
    query = sql.SQL("SELECT ARRAY[{}]::boolean[] FROM {} WHERE t.id = {}").format(
        sql.SQL(", ").join(predicates), CONTEXT, sql.Placeholder()
    )
    found = conn.execute(query, [*params, trigger_id]).fetchall()
    assert len(found) == 1
    return list(found[0][0])


# --- the strategies ----------------------------------------------------------------------------------------

#: Strings that would break SQL, a format string or a naive case fold, if they were ever spliced in.
HOSTILE = (
    "",
    " ",
    "'",
    "''",
    '"',
    "' OR '1'='1",
    "'; DROP TABLE contacts; --",
    "--",
    "/*",
    ";",
    "\\",
    "\\'",
    "%s",
    "%(x)s",
    "%%",
    "%_",
    "{}",
    "{0}",
    "$1",
    "?",
    "É",
    "é",
    "ß",
    "SS",
    "straße",
    "İ",
    "\u0131",  # DOTLESS I: its Unicode upper case is an ASCII I
    "\u212a",  # KELVIN SIGN: Unicode lowers it to an ASCII k
    "ǅ",
    "🙂",
    "👍🏽",
    "日本",
    "a\tb\n",
)
VOCAB: dict[str, tuple[str, ...]] = {
    "contact.name": ("Alice", "alice smith", "Bob", "Émile", "STOP"),
    "contact.phone": ("+15550001", "+15550002", "+1555"),
    "contact.timezone": ("Europe/Paris", "America/New_York", "UTC"),
    "contact.consent": ("unknown", "granted", "revoked"),
    "contact.tags": ("vip", "lead", "Churn", "é"),
    "conversation.status": ("open", "pending", "snoozed", "resolved"),
    "conversation.priority": ("low", "medium", "high", "urgent"),
    "conversation.labels": ("urgent", "billing", "Bug"),
    "conversation.assignee": ("agent-1", "Agent-2", "ana"),
    "conversation.team": ("sales", "Support", "ventes"),
    "conversation.inbox": ("main", "Main/Sub", "vip"),
    "conversation.number": tuple(str(n) for n in NUMBER_IDS),
    "message.type": ("incoming", "outgoing"),
    "message.content": ("stop", "STOP please", "hello", "Ça va?"),
    "lead.status": ("open", "qualified", "won", "foreign"),
    "deal.stage": ("new", "proposal", "won", "foreign"),
}
#: Custom attribute keys (a condition names ``contact.attributes.<key>``).
KEYS = (
    "score",
    "Score",
    "plan",
    "vip",
    "a.b",
    "it's",
    'say "hi"',
    "--",
    "%s",
    "%(x)s",
    "{}",
    "É",
    "🙂",
    "k" * 64,
)
CUSTOM_TEXT = ("gold", "Gold", "silver", "", "80", "true", "vip")
NUMBERS = (0, 1, -1, 1.5, 80, 80.0, 79.99, 100, 0.1, 1e-7, -0.0, 10**14, 999999999999999, -999999999999999.9)
#: What the payload's ``changed`` may name (attribute names, a custom one, near misses).
CHANGED_KEYS = (
    *(name for name in KINDS if name != "changed"),
    *(CUSTOM_PREFIX + key for key in ("score", "plan", "it's")),
    "Conversation.Status",
    "other",
    "'",
)
VOCAB["changed"] = CHANGED_KEYS
#: The ``from`` / ``to`` values of a change (1 and 1.0 are the same JSON value; [1] and 1 are not).
CHANGE_VALUES: tuple[Any, ...] = (
    "open",
    "OPEN",
    "pending",
    "",
    "vip",
    "É",
    "'",
    1,
    1.0,
    2,
    0,
    True,
    False,
    None,
    [],
    ["vip"],
    ["VIP"],
    [1, "vip"],
    [1.0, "vip"],
    [[]],
)

ODD_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6)
NUMBER = st.one_of(
    st.sampled_from(NUMBERS),
    st.integers(-1000, 1000),
    st.floats(-1e14, 1e14, allow_nan=False, allow_infinity=False),
)
ABSENT = object()
NOTHING: SearchStrategy[Any] = st.nothing()


#: Ways to write a text in another case (Python's mapping: non-ASCII letters change too).
CASES: tuple[Callable[[str], str], ...] = (str.upper, str.lower, str.swapcase, str.title)


def recased(texts: SearchStrategy[str]) -> SearchStrategy[str]:
    """One of ``texts`` as written or in another case."""
    return st.tuples(texts, st.sampled_from(CASES), st.booleans()).map(
        lambda drawn: drawn[1](drawn[0]) if drawn[2] else drawn[0]
    )


def _piece(drawn: tuple[str, int, int]) -> str:
    text, i, j = drawn
    start, end = sorted((i % (len(text) + 1), j % (len(text) + 1)))
    return text[start:end]


def pieces(texts: SearchStrategy[str]) -> SearchStrategy[str]:
    """A piece of one of ``texts`` (prefixes included)."""
    return st.tuples(texts, st.integers(0, 64), st.integers(0, 64)).map(_piece)


@cache
def words(pool: tuple[str, ...]) -> SearchStrategy[str]:
    return recased(st.sampled_from(pool))


@cache
def condition_text(attribute: str) -> SearchStrategy[str]:
    """A value a condition compares ``attribute`` with: mostly near what the contexts hold."""
    pool = CUSTOM_TEXT if attribute.startswith(CUSTOM_PREFIX) else VOCAB[attribute]
    return st.one_of(words(pool), pieces(st.sampled_from(pool)), words(HOSTILE), ODD_TEXT)


#: In the hostile trees every string is hostile; those with MARK in them cannot occur in any SQL text.
MARK = "¤"
MARKED = st.tuples(st.sampled_from(HOSTILE), st.sampled_from(HOSTILE)).map(lambda ab: f"{ab[0]}{MARK}{ab[1]}")
HOSTILE_TEXT = st.one_of(MARKED, st.sampled_from(HOSTILE), ODD_TEXT.map(lambda text: MARK + text))


@dataclass(frozen=True)
class Pools:
    """Where a tree's values come from (each a function of the attribute the leaf is about)."""

    text: Callable[[str], SearchStrategy[str]]
    number: Callable[[str], SearchStrategy[int | float]]
    #: ``attribute_changed``'s value: {from, to}, one of them at least
    change: Callable[[str], SearchStrategy[dict[str, Any]]]
    key: SearchStrategy[str]
    #: More attributes to draw leaves about (those the context's changed names)
    attribute: SearchStrategy[str] = NOTHING


def ends_of(values: SearchStrategy[Any]) -> SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.fixed_dictionaries({"from": values}),
        st.fixed_dictionaries({"to": values}),
        st.fixed_dictionaries({"from": values, "to": values}),
    )


NORMAL = Pools(
    text=condition_text,
    number=lambda attribute: NUMBER,
    change=lambda attribute: ends_of(st.sampled_from(CHANGE_VALUES)),
    key=st.sampled_from(KEYS),
)
HOSTILE_POOLS = Pools(
    text=lambda attribute: HOSTILE_TEXT,
    number=lambda attribute: NUMBER,
    change=lambda attribute: ends_of(
        st.one_of(HOSTILE_TEXT, st.lists(HOSTILE_TEXT, max_size=3), NUMBER, st.booleans(), st.none())
    ),
    key=st.one_of(MARKED, st.sampled_from([text for text in HOSTILE if text])),
)


def make_leaf(attribute: str, operator: str, value: Any = ABSENT) -> dict[str, Any]:
    raw: dict[str, Any] = {"attribute": attribute, "operator": operator}
    if value is not ABSENT:
        raw["value"] = value
    return raw


def choices(attribute: str, pools: Pools) -> list[tuple[str, SearchStrategy[Any]]]:
    """Every operator that applies to ``attribute``, with a strategy for its value (a custom attribute's
    comparisons: one for each type of value)."""
    kind = "custom" if attribute.startswith(CUSTOM_PREFIX) else KINDS[attribute]
    presence = st.sampled_from([ABSENT, None])
    out: list[tuple[str, SearchStrategy[Any]]] = [("is_present", presence), ("is_not_present", presence)]
    if kind != "changed":
        out.append(("attribute_changed", pools.change(attribute)))
    if kind in ("bool", "custom"):
        out += [(operator, st.booleans()) for operator in ("equal_to", "not_equal_to")]
    if kind in ("text", "list", "custom", "changed"):
        text = pools.text(attribute)
        singles = ["contains", "does_not_contain"]
        if kind != "changed":
            singles += ["equal_to", "not_equal_to"] + ([] if kind == "list" else ["starts_with"])
            out += [(operator, st.lists(text, min_size=1, max_size=4)) for operator in ("in", "not_in")]
        out += [(operator, text) for operator in singles]
    if kind == "custom":
        numbers = pools.number(attribute)
        out += [(op, numbers) for op in ("equal_to", "not_equal_to", "is_greater_than", "is_less_than")]
        out += [(op, st.lists(numbers, min_size=1, max_size=4)) for op in ("in", "not_in")]
    return out


def leaf_of(attribute: str, pools: Pools) -> SearchStrategy[dict[str, Any]]:
    """A valid leaf about ``attribute``: any operator that applies to it, with a value of the right type."""
    return st.one_of(
        [
            values.map(partial(make_leaf, attribute, operator))
            for operator, values in choices(attribute, pools)
        ]
    )


def leaves(pools: Pools) -> SearchStrategy[dict[str, Any]]:
    """A leaf: about a catalogue attribute, a custom one, or one the context's changed names.

    (``.map(dict)`` keeps a one_of from being flattened into the one_of around it, which would weigh
    each of its branches like the other branches there.)"""
    about = cache(partial(leaf_of, pools=pools))
    return st.one_of(
        st.one_of([about(name) for name in KINDS]).map(dict),
        pools.key.flatmap(lambda key: about(CUSTOM_PREFIX + key)),
        pools.attribute.flatmap(about),
    )


def depth_of(raw: Any) -> int:
    if "all" in raw or "any" in raw:
        return 1 + max((depth_of(child) for children in raw.values() for child in children), default=0)
    return 0


def trees(leaf: SearchStrategy[dict[str, Any]], depth: int = 4) -> SearchStrategy[Any]:
    """Raw (JSON) trees: a leaf, or all / any groups nested up to ``depth`` deep."""
    return st.recursive(
        leaf,
        lambda children: st.tuples(st.sampled_from(["all", "any"]), st.lists(children, max_size=4)).map(
            lambda kind_children: {kind_children[0]: kind_children[1]}
        ),
        max_leaves=12,
    ).filter(lambda raw: depth_of(raw) <= depth)


def required_text(attribute: str) -> SearchStrategy[str]:
    """What a context holds for a text ``attribute``: near what the conditions ask, or hostile."""
    return st.one_of(words(VOCAB[attribute]), words(VOCAB[attribute]), st.sampled_from(HOSTILE))


def stored_text(attribute: str) -> SearchStrategy[str | None]:
    return st.one_of(st.none(), required_text(attribute), required_text(attribute))


def items(attribute: str) -> SearchStrategy[list[str | None]]:
    word = words(VOCAB[attribute])
    return st.lists(st.one_of(word, word, st.sampled_from(HOSTILE), st.none()), max_size=4)


STORED_VALUE = st.one_of(
    words(CUSTOM_TEXT),
    st.sampled_from(HOSTILE),
    NUMBER,
    st.sampled_from([10**20, 1e20, 1e-30]),
    st.booleans(),
    st.none(),
    st.sampled_from([[], ["gold"], [80], {"a": 1}]),
)
CHANGE_VALUE = st.sampled_from(CHANGE_VALUES)
CHANGE_ENTRY = st.one_of(
    ends_of(CHANGE_VALUE),
    ends_of(CHANGE_VALUE),
    st.sampled_from([{}, None, "open", 1, [], {"from": {"a": 1}}, {"from": 1, "to": 2, "by": "x"}]),
)
CONVERSATIONS = st.builds(
    Conversation,
    status=st.sampled_from(VOCAB["conversation.status"]),
    priority=st.one_of(st.none(), st.sampled_from(VOCAB["conversation.priority"])),
    assignee=stored_text("conversation.assignee"),
    team=stored_text("conversation.team"),
    inbox=stored_text("conversation.inbox"),
    number=st.one_of(st.none(), st.integers(0, len(NUMBER_IDS) - 1)),
    labels=items("conversation.labels"),
)
REF = st.one_of(st.sampled_from(["absent", "null", "foreign", "unknown"]), st.integers(0, 2))
MESSAGES = st.fixed_dictionaries(
    {}, optional={"type": stored_text("message.type"), "content": stored_text("message.content")}
)
CONTEXTS = st.builds(
    Context,
    name=stored_text("contact.name"),
    phone=st.one_of(st.none(), st.sampled_from(VOCAB["contact.phone"])),
    timezone=stored_text("contact.timezone"),
    consent=st.sampled_from(VOCAB["contact.consent"]),
    opted_out=st.booleans(),
    tags=items("contact.tags"),
    attributes=st.dictionaries(st.sampled_from(KEYS), STORED_VALUE, max_size=6),
    conversation=st.one_of(st.none(), CONVERSATIONS, CONVERSATIONS),
    leads=st.lists(st.tuples(required_text("lead.status"), st.integers(0, 2)), max_size=3),
    deals=st.lists(st.tuples(required_text("deal.stage"), st.integers(0, 2)), max_size=3),
    lead_ref=REF,
    deal_ref=REF,
    message=st.one_of(st.none(), MESSAGES, MESSAGES),
    changed=st.one_of(st.none(), st.dictionaries(st.sampled_from(CHANGED_KEYS), CHANGE_ENTRY, max_size=5)),
)


def unique(values: list[Any]) -> list[Any]:
    """``values`` without repeats, in order (not a set: hypothesis needs the same order every run)."""
    out: list[Any] = []
    for value in values:
        if not any(value == seen and type(value) is type(seen) for seen in out):
            out.append(value)
    return out


def seen_text(ctx: Context, attribute: str) -> list[str]:
    """The strings ``ctx`` holds where a condition about ``attribute`` looks (first: the very value)."""
    if attribute.startswith(CUSTOM_PREFIX):
        own = ctx.attributes.get(attribute.removeprefix(CUSTOM_PREFIX))
        found: list[Any] = [own, *ctx.attributes.values()]
    elif attribute == "changed":
        found = list(ctx.changed or {})
    elif attribute == "lead.status":  # every lead's, not only the one the context picks
        found = [attribute_value(ctx, attribute)] + [status for status, _ in ctx.leads]
    elif attribute == "deal.stage":
        found = [attribute_value(ctx, attribute)] + [stage for stage, _ in ctx.deals]
    else:
        value = attribute_value(ctx, attribute)
        found = value if isinstance(value, list) else [value]
    return unique([item for item in found if isinstance(item, str)])


def near(values: list[Any], others: SearchStrategy[Any], parts: bool = True) -> SearchStrategy[Any]:
    """Mostly one of ``values`` (strings: in any case, or a piece), else one of ``others``."""
    if not values:
        return others
    pick = st.sampled_from(values)
    if all(isinstance(value, str) for value in values):
        return st.one_of(recased(pick), recased(pick), pieces(pick) if parts else pick, others)
    return st.one_of(pick, pick, others)


def twin(value: Any) -> Any:
    """The same JSON value written another way: 1 as 1.0 (and 1.0 as 1), in lists too."""
    if isinstance(value, list):
        return [twin(item) for item in value]
    if json_kind(value) == "number" and float(value).is_integer():
        return float(value) if isinstance(value, int) else int(value)
    return value


def is_end(value: Any) -> bool:
    """Whether ``value`` may be a from / to of attribute_changed (no object, no NUL)."""
    if isinstance(value, list):
        return len(value) <= MAX_LIST and all(is_end(item) for item in value)
    return not isinstance(value, dict)


def changed_attributes(ctx: Context) -> list[str]:
    """The attributes (valid in a condition) that the context's changed names."""
    return [
        name
        for name in ctx.changed or {}
        if (name in KINDS and name != "changed")
        or (name.startswith(CUSTOM_PREFIX) and 1 <= len(name.removeprefix(CUSTOM_PREFIX)) <= 64)
    ]


def context_pools(ctx: Context) -> Pools:
    """Pools whose values are mostly what ``ctx`` holds, so that leaves match often."""
    changed = ctx.changed or {}
    entries = {name: entry for name, entry in changed.items() if isinstance(entry, dict)}
    all_ends = unique([value for entry in entries.values() for value in entry.values() if is_end(value)])

    def change(attribute: str) -> SearchStrategy[dict[str, Any]]:
        generic = ends_of(near(all_ends, CHANGE_VALUE))
        entry = entries.get(attribute, {})
        own = [{end: entry[end]} for end in ("from", "to") if end in entry and is_end(entry[end])]
        if len(own) == 2:
            own.append(own[0] | own[1])
        own += [{end: twin(value) for end, value in ends.items()} for ends in own]
        return st.one_of(st.sampled_from(own), st.sampled_from(own), generic) if own else generic

    def numbers(attribute: str) -> SearchStrategy[int | float]:
        own = ctx.attributes.get(attribute.removeprefix(CUSTOM_PREFIX))
        stored = [own, *ctx.attributes.values()]
        return near(unique([v for v in stored if json_kind(v) == "number" and abs(v) < 1e15]), NUMBER)

    names = changed_attributes(ctx)
    return Pools(
        text=cache(lambda attribute: near(seen_text(ctx, attribute), condition_text(attribute))),
        number=cache(numbers),
        change=cache(change),
        key=near(list(ctx.attributes), st.sampled_from(KEYS), parts=False),
        attribute=st.sampled_from(names) if names else NOTHING,
    )


@st.composite
def examples(draw: st.DrawFn) -> tuple[Context, list[Any]]:
    """A context, and conditions about it: a leaf for every attribute and every operator that applies to it
    (custom: each key the context has, and one more), then random trees."""
    ctx = draw(CONTEXTS)
    pools = context_pools(ctx)
    custom = [*ctx.attributes, draw(st.sampled_from(KEYS))]
    attributes = unique([*KINDS, *(CUSTOM_PREFIX + key for key in custom), *changed_attributes(ctx)])
    probes = [
        make_leaf(attribute, operator, draw(values))
        for attribute in attributes
        for operator, values in choices(attribute, pools)
    ]
    return ctx, probes + draw(st.lists(trees(leaves(pools)), min_size=1, max_size=12))


QUICK = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


# --- the differential test ---------------------------------------------------------------------------------


def test_the_evaluator_knows_every_attribute_of_the_catalogue() -> None:
    assert set(KINDS) == set(ATTRIBUTES)


# no shrinking: an example is a few hundred leaves, each alone already; a failure names the leaves that
# disagree, where shrinking them would take minutes
@settings(QUICK, max_examples=80, phases=[Phase.explicit, Phase.generate])
@given(example=examples())
def test_sql_agrees_with_the_documented_semantics(
    pool: ConnectionPool, project: Project, example: tuple[Context, list[Any]]
) -> None:
    ctx, raws = example
    nodes = [parse_conditions(raw) for raw in raws]
    for node in nodes:
        assert parse_conditions(node.to_json()) == node
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        trigger_id = store(conn, project.id, ctx)
        found = evaluate(conn, nodes, trigger_id)
    wrong = [
        f"{node.to_json()}: SQL {result}, expected {expected}"
        for node, result in zip(nodes, found, strict=True)
        if result is not (expected := holds(node, ctx))
    ]
    assert not wrong, "\n".join([f"{len(wrong)} of {len(nodes)} trees disagree:", *wrong[:20]])


# the semantics spelled out on one context (each also checks the evaluator itself)
EXAMPLE = Context(
    name="STOP Émile",
    phone=None,
    timezone="",
    consent="granted",
    opted_out=False,
    tags=["VIP", "lead", None],
    attributes={"score": 80, "plan": "Gold", "flag": True, "empty": "", "gone": None, "list": ["gold"]},
    conversation=None,
    leads=[("open", 0), ("won", 5), ("lost", 5)],
    deals=[("new", 9), ("proposal", 1)],
    lead_ref="foreign",
    deal_ref=1,
    message={"type": "incoming", "content": "Please STOP"},
    changed={
        "conversation.status": {"from": "open", "to": "pending"},
        "contact.tags": {"from": [1], "to": None},
    },
)


def _leaf(attribute: Any, operator: Any, value: Any = ABSENT) -> dict[str, Any]:
    """A raw leaf (attribute and operator of any type, to write invalid ones too)."""
    return make_leaf(attribute, operator, value)


SEMANTICS: list[tuple[Any, bool]] = [
    (None, True),
    ({"any": []}, False),
    (_leaf("contact.name", "starts_with", "stop"), True),
    (_leaf("contact.name", "contains", "émile"), False),  # É is not ASCII: no fold
    (_leaf("contact.name", "contains", "ÉMILE"), True),
    (_leaf("contact.name", "equal_to", "stop émile"), False),
    (_leaf("contact.phone", "is_present"), False),
    (_leaf("contact.phone", "not_equal_to", "+1"), True),  # absent: the positive is false
    (_leaf("contact.phone", "does_not_contain", ""), True),
    (_leaf("contact.timezone", "is_present"), False),  # "" is not present
    (_leaf("contact.timezone", "contains", ""), True),  # ... but is a value
    (_leaf("contact.consent", "in", ["revoked", "GRANTED"]), True),
    (_leaf("contact.opted_out", "equal_to", False), True),
    (_leaf("contact.opted_out", "is_present"), True),
    (_leaf("contact.tags", "contains", "vip"), True),
    (_leaf("contact.tags", "equal_to", "LEAD"), True),
    (_leaf("contact.tags", "contains", "vi"), False),
    (_leaf("contact.tags", "in", ["x", "Lead"]), True),
    (_leaf("contact.tags", "not_in", ["x", "y"]), True),
    (_leaf("contact.attributes.score", "is_greater_than", 79.5), True),
    (_leaf("contact.attributes.score", "equal_to", 80.0), True),
    (_leaf("contact.attributes.score", "in", [1, 80]), True),
    (_leaf("contact.attributes.score", "equal_to", "80"), False),  # a string never matches a number
    (_leaf("contact.attributes.score", "not_in", ["80"]), True),
    (_leaf("contact.attributes.plan", "equal_to", "GOLD"), True),
    (_leaf("contact.attributes.plan", "is_less_than", 1), False),
    (_leaf("contact.attributes.flag", "equal_to", True), True),
    (_leaf("contact.attributes.flag", "equal_to", "true"), False),
    (_leaf("contact.attributes.empty", "is_present"), False),
    (_leaf("contact.attributes.gone", "is_not_present"), True),
    (_leaf("contact.attributes.list", "is_present"), True),
    (_leaf("contact.attributes.list", "contains", "gold"), False),  # not a string
    (_leaf("contact.attributes.missing", "not_equal_to", 1), True),
    (_leaf("conversation.status", "equal_to", "open"), False),  # no conversation
    (_leaf("conversation.status", "not_equal_to", "open"), True),
    (_leaf("conversation.labels", "is_not_present"), True),
    (_leaf("message.type", "equal_to", "INCOMING"), True),
    (_leaf("message.content", "contains", "stop"), True),
    # the newest, of two: the lowest id (another contact's lead, though the payload's, is not the event's)
    (_leaf("lead.status", "equal_to", "won"), True),
    (_leaf("deal.stage", "equal_to", "proposal"), True),  # the event's own deal, though not the newest
    (_leaf("changed", "contains", "conversation.status"), True),
    (_leaf("changed", "contains", "Conversation.Status"), False),  # attribute names are not text
    (_leaf("changed", "is_present"), True),
    (_leaf("conversation.status", "attribute_changed", {"to": "pending"}), True),
    (_leaf("conversation.status", "attribute_changed", {"from": "open", "to": "resolved"}), False),
    (_leaf("conversation.status", "attribute_changed", {"to": "PENDING"}), False),  # JSON: as written
    (_leaf("contact.tags", "attribute_changed", {"from": [1.0], "to": None}), True),
    (_leaf("contact.tags", "attribute_changed", {"from": 1}), False),
    (_leaf("contact.name", "attribute_changed", {"from": None}), False),
    (
        {
            "all": [
                _leaf("contact.tags", "contains", "vip"),
                {
                    "any": [
                        _leaf("conversation.status", "equal_to", "open"),
                        _leaf("lead.status", "in", ["won"]),
                    ]
                },
            ]
        },
        True,
    ),
]


def test_semantics_on_an_example(pool: ConnectionPool, project: Project) -> None:
    nodes = [parse_conditions(raw) for raw, _ in SEMANTICS]
    expected = [want for _, want in SEMANTICS]
    assert [holds(node, EXAMPLE) for node in nodes] == expected
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        found = evaluate(conn, nodes, store(conn, project.id, EXAMPLE))
    assert found == expected


# --- no value reaches the SQL text -------------------------------------------------------------------------


def blunt(raw: Any) -> Any:
    """The same tree with every string a plain "x" (custom keys "k"), numbers 0: the same types."""

    def value(item: Any) -> Any:
        if isinstance(item, str):
            return "x"
        if isinstance(item, list):
            return [value(i) for i in item]
        if isinstance(item, dict):
            return {key: value(i) for key, i in item.items()}
        return 0 if json_kind(item) == "number" else item

    if "all" in raw or "any" in raw:
        return {kind: [blunt(child) for child in children] for kind, children in raw.items()}
    out = dict(raw)
    if raw["attribute"].startswith(CUSTOM_PREFIX):
        out["attribute"] = CUSTOM_PREFIX + "k"
    if "value" in raw:
        out["value"] = value(raw["value"])
    return out


def strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [text for item in value for text in strings_in(item)]
    if isinstance(value, dict):
        return [text for item in value.values() for text in strings_in(item)]
    if isinstance(value, Jsonb):
        return strings_in(value.obj)
    return []


def user_strings(raw: Any) -> list[str]:
    """Every string a user gave in a raw tree: values and custom keys."""
    if "all" in raw or "any" in raw:
        return [text for children in raw.values() for child in children for text in user_strings(child)]
    found = strings_in(raw.get("value"))
    if raw["attribute"].startswith(CUSTOM_PREFIX):
        found.append(raw["attribute"].removeprefix(CUSTOM_PREFIX))
    return found


@settings(QUICK, max_examples=150)
@given(raw=trees(leaves(HOSTILE_POOLS)))
def test_values_and_keys_are_bound_never_written_into_the_sql(pool: ConnectionPool, raw: Any) -> None:
    predicate, params = compile_conditions(parse_conditions(raw))
    skeleton, _ = compile_conditions(parse_conditions(blunt(raw)))
    bound = strings_in(params)
    with pool.connection() as conn:
        text = predicate.as_string(conn)
        # the SQL text does not depend on the values at all, and has one placeholder per parameter
        assert text == skeleton.as_string(conn)
        assert text.count("%s") == len(params)
        assert "%(" not in text
        assert MARK not in text
        for given_text in user_strings(raw):
            if MARK in given_text:
                assert given_text not in text
            # bound as given (a custom key within the attribute name attribute_changed binds)
            assert any(given_text in param for param in bound), given_text
        # and the server takes it as it is
        query = sql.SQL("SELECT {} FROM {} WHERE t.id = -1").format(predicate, CONTEXT)
        assert conn.execute(query, params).fetchall() == []


# --- validation --------------------------------------------------------------------------------------------


def string_slots(
    raw: Any, where: tuple[Any, ...] = (), field: str = "conditions"
) -> list[tuple[tuple[Any, ...], str]]:
    """Where a raw tree holds a user's string (a path into it), and the dotted path that names it."""
    if "all" in raw or "any" in raw:
        kind = "all" if "all" in raw else "any"
        return [
            slot
            for i, child in enumerate(raw[kind])
            for slot in string_slots(child, (*where, kind, i), f"{field}.{kind}.{i}")
        ]
    slots = []
    if raw["attribute"].startswith(CUSTOM_PREFIX):
        slots.append(((*where, "attribute"), f"{field}.attribute"))

    def values(value: Any, at: tuple[Any, ...], name: str) -> None:
        if isinstance(value, str):
            slots.append((at, name))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                values(item, (*at, i), f"{name}.{i}")
        elif isinstance(value, dict):
            for end, item in value.items():
                values(item, (*at, end), f"{name}.{end}")

    if "value" in raw:
        values(raw["value"], (*where, "value"), f"{field}.value")
    return slots


@settings(max_examples=300, deadline=None, database=None)
@given(raw=trees(leaves(NORMAL)), data=st.data())
def test_a_nul_character_anywhere_is_rejected_naming_its_path(raw: Any, data: st.DataObject) -> None:
    slots = string_slots(raw)
    assume(slots)
    where, field = data.draw(st.sampled_from(slots))
    broken = json.loads(json.dumps(raw))  # not deepcopy: that keeps a list the pools gave twice shared
    holder = broken
    for step in where[:-1]:
        holder = holder[step]
    text = holder[where[-1]]
    start = len(CUSTOM_PREFIX) if where[-1] == "attribute" else 0
    at = data.draw(st.integers(start, len(text)))
    holder[where[-1]] = text[:at] + "\x00" + text[at:]
    parse_conditions(raw)  # valid without it
    with pytest.raises(InvalidInput) as caught:
        parse_conditions(broken)
    assert caught.value.field == field


LEAF = _leaf("contact.name", "equal_to", "x")


def nest(inner: Any, groups: int) -> Any:
    for _ in range(groups):
        inner = {"all": [inner]}
    return inner


DEEPEST = ".all.0" * (MAX_DEPTH + 1)
K = "contact.attributes.k"

INVALID: list[tuple[str, Any, str]] = [
    # shape
    ("a list", [LEAF], "conditions"),
    ("a string", "all", "conditions"),
    ("a child that is not an object", {"all": [LEAF, 5]}, "conditions.all.1"),
    ("a child that is a list", {"any": [[LEAF]]}, "conditions.any.0"),
    ("a group's list is an object", {"all": {"x": LEAF}}, "conditions.all"),
    ("a group's list is null", {"any": None}, "conditions.any"),
    ("all and any at once", {"all": [], "any": []}, "conditions"),
    ("a group with a leaf's key", {"any": [LEAF], "value": 1}, "conditions"),
    ("a nested group with extra keys", {"all": [{"any": [], "negate": True}]}, "conditions.all.0"),
    ("an unknown key in a leaf", {**LEAF, "negate": True}, "conditions.negate"),
    ("the first unknown key is named", {"all": [{**LEAF, "zeta": 1, "alpha": 2}]}, "conditions.all.0.alpha"),
    ("values for value", _leaf("contact.tags", "in") | {"values": ["a"]}, "conditions.values"),
    ("too deep: a leaf", nest(LEAF, MAX_DEPTH + 1), "conditions" + DEEPEST),
    ("too deep: a group", nest({"any": []}, MAX_DEPTH + 1), "conditions" + DEEPEST),
    ("too many leaves", {"all": [LEAF] * (MAX_LEAVES + 1)}, f"conditions.all.{MAX_LEAVES}"),
    (
        "too many leaves, counted across groups",
        {"any": [{"all": [LEAF] * 60}, {"all": [LEAF] * (MAX_LEAVES - 59)}]},
        f"conditions.any.1.all.{MAX_LEAVES - 60}",
    ),
    # attribute
    ("an empty object", {}, "conditions.attribute"),
    ("no attribute", {"operator": "equal_to", "value": "x"}, "conditions.attribute"),
    ("an attribute that is not a string", _leaf(5, "equal_to", "x"), "conditions.attribute"),
    (
        "an unknown attribute",
        {"all": [{"any": [_leaf("contact.nope", "equal_to", "x")]}]},
        "conditions.all.0.any.0.attribute",
    ),
    ("attribute names are exact", _leaf("Contact.Name", "equal_to", "x"), "conditions.attribute"),
    ("the custom prefix alone", _leaf("contact.attributes", "equal_to", "x"), "conditions.attribute"),
    ("an empty custom key", _leaf("contact.attributes.", "equal_to", "x"), "conditions.attribute"),
    ("a custom key too long", _leaf(CUSTOM_PREFIX + "k" * 65, "equal_to", "x"), "conditions.attribute"),
    (
        "attribute_changed of changed",
        _leaf("changed", "attribute_changed", {"to": 1}),
        "conditions.attribute",
    ),
    # operator
    ("no operator", {"attribute": "contact.name", "value": "x"}, "conditions.operator"),
    ("an unknown operator", _leaf("contact.name", "equals", "x"), "conditions.operator"),
    ("operators are exact", _leaf("contact.name", "Equal_To", "x"), "conditions.operator"),
    ("an operator that is a list", _leaf("contact.name", ["equal_to"], "x"), "conditions.operator"),
    ("is_greater_than on a list", _leaf("contact.tags", "is_greater_than", "x"), "conditions.operator"),
    ("starts_with on a list", _leaf("contact.tags", "starts_with", "x"), "conditions.operator"),
    ("is_less_than on text", _leaf("contact.name", "is_less_than", "x"), "conditions.operator"),
    ("contains on a boolean", _leaf("contact.opted_out", "contains", "x"), "conditions.operator"),
    ("in on a boolean", _leaf("contact.opted_out", "in", [True]), "conditions.operator"),
    ("equal_to on changed", _leaf("changed", "equal_to", "x"), "conditions.operator"),
    ("in on changed", _leaf("changed", "in", ["x"]), "conditions.operator"),
    ("a string is not compared as a number", _leaf(K, "is_greater_than", "80"), "conditions.operator"),
    ("starts_with on a custom number", _leaf(K, "starts_with", 8), "conditions.operator"),
    ("contains on a custom boolean", _leaf(K, "contains", True), "conditions.operator"),
    ("in on a custom boolean", _leaf(K, "in", [True, False]), "conditions.operator"),
    ("is_less_than on a custom boolean", _leaf(K, "is_less_than", True), "conditions.operator"),
    # value
    ("a number for text", _leaf("contact.name", "equal_to", 5), "conditions.value"),
    ("a boolean for text", _leaf("contact.name", "contains", True), "conditions.value"),
    ("no value", _leaf("contact.name", "equal_to"), "conditions.value"),
    ("a null value", _leaf("contact.name", "starts_with", None), "conditions.value"),
    ("a list for equal_to", _leaf("contact.name", "equal_to", ["x"]), "conditions.value"),
    ("a string for a boolean", _leaf("contact.opted_out", "equal_to", "true"), "conditions.value"),
    ("a number for a boolean", _leaf("contact.opted_out", "not_equal_to", 1), "conditions.value"),
    ("a number for a tag", _leaf("contact.tags", "contains", 5), "conditions.value"),
    ("a number for changed", _leaf("changed", "contains", 5), "conditions.value"),
    ("text too long", _leaf("message.content", "contains", "x" * (MAX_TEXT + 1)), "conditions.value"),
    ("no custom value", _leaf(K, "equal_to"), "conditions.value"),
    ("an object for a custom value", _leaf(K, "equal_to", {"a": 1}), "conditions.value"),
    ("a list for a custom equal_to", _leaf(K, "equal_to", [1]), "conditions.value"),
    ("a number too large", _leaf(K, "is_greater_than", 1e15), "conditions.value"),
    ("a number too small", _leaf(K, "is_less_than", -(10**15)), "conditions.value"),
    ("NaN", _leaf(K, "equal_to", math.nan), "conditions.value"),
    ("infinity", _leaf(K, "is_less_than", math.inf), "conditions.value"),
    # in
    ("in with an empty list", _leaf("contact.name", "in", []), "conditions.value"),
    ("not_in with an empty list", _leaf("contact.tags", "not_in", []), "conditions.value"),
    ("custom in with an empty list", _leaf(K, "in", []), "conditions.value"),
    ("in with a string", _leaf("contact.name", "in", "x"), "conditions.value"),
    ("in with too many values", _leaf("contact.name", "in", ["x"] * (MAX_LIST + 1)), "conditions.value"),
    ("a number in a text list", _leaf("contact.name", "in", ["a", 5]), "conditions.value.1"),
    ("a null in a tag list", _leaf("contact.tags", "in", ["a", "b", None]), "conditions.value.2"),
    ("a list in a tag list", _leaf("contact.tags", "not_in", ["a", ["b"]]), "conditions.value.1"),
    ("a string in a custom number list", _leaf(K, "in", [1, "a"]), "conditions.value.1"),
    ("a number in a custom text list", _leaf(K, "not_in", ["a", 1]), "conditions.value.1"),
    ("a boolean in a custom number list", _leaf(K, "in", [1, True]), "conditions.value.1"),
    ("NaN in a custom number list", _leaf(K, "in", [1, 2, math.nan]), "conditions.value.2"),
    ("text too long in a list", _leaf("deal.stage", "in", ["a", "x" * (MAX_TEXT + 1)]), "conditions.value.1"),
    # presence
    ("is_present with a value", _leaf("contact.name", "is_present", "x"), "conditions.value"),
    ("is_not_present with false", _leaf("contact.opted_out", "is_not_present", False), "conditions.value"),
    ("custom is_present with a value", _leaf(K, "is_present", 1), "conditions.value"),
    ("changed is_present with a value", _leaf("changed", "is_present", "x"), "conditions.value"),
    # attribute_changed
    ("attribute_changed without a value", _leaf("contact.name", "attribute_changed"), "conditions.value"),
    ("attribute_changed with a string", _leaf("contact.name", "attribute_changed", "x"), "conditions.value"),
    ("attribute_changed with {}", _leaf("contact.name", "attribute_changed", {}), "conditions.value"),
    (
        "attribute_changed with another key",
        _leaf(K, "attribute_changed", {"from": 1, "by": 2}),
        "conditions.value",
    ),
    (
        "a change from an object",
        _leaf("contact.name", "attribute_changed", {"from": {"a": 1}}),
        "conditions.value.from",
    ),
    (
        "an object in a change",
        _leaf("contact.tags", "attribute_changed", {"to": [1, {}]}),
        "conditions.value.to.1",
    ),
    ("a change to NaN", _leaf(K, "attribute_changed", {"from": 1, "to": math.nan}), "conditions.value.to"),
    (
        "a change from a long text",
        _leaf(K, "attribute_changed", {"from": "x" * (MAX_TEXT + 1)}),
        "conditions.value.from",
    ),
    (
        "a change to a long list",
        _leaf("contact.tags", "attribute_changed", {"to": [0] * (MAX_LIST + 1)}),
        "conditions.value.to",
    ),
    (
        "deep in a change",
        _leaf("contact.tags", "attribute_changed", {"to": [[1, "x" * (MAX_TEXT + 1)]]}),
        "conditions.value.to.0.1",
    ),
    # NUL
    ("NUL in a value", _leaf("contact.name", "contains", "a\x00b"), "conditions.value"),
    ("NUL alone", {"any": [LEAF, _leaf("message.content", "equal_to", "\x00")]}, "conditions.any.1.value"),
    ("NUL in a list value", _leaf("contact.tags", "in", ["a", "\x00"]), "conditions.value.1"),
    ("NUL in a custom key", _leaf(K + "\x00", "equal_to", "x"), "conditions.attribute"),
    (
        "NUL in a custom key's presence",
        _leaf("contact.attributes.\x00", "is_present"),
        "conditions.attribute",
    ),
    ("NUL in changed", _leaf("changed", "does_not_contain", "contact.\x00name"), "conditions.value"),
    (
        "NUL in a change",
        _leaf("contact.name", "attribute_changed", {"from": "a", "to": "\x00"}),
        "conditions.value.to",
    ),
    (
        "NUL in a changed list",
        _leaf("contact.tags", "attribute_changed", {"from": ["a", "\x00"]}),
        "conditions.value.from.1",
    ),
]


@pytest.mark.parametrize(
    ("raw", "field"), [(raw, field) for _, raw, field in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_conditions_are_rejected_naming_the_field(raw: Any, field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_conditions(raw)
    assert caught.value.field == field


def test_the_field_is_named_under_the_callers_prefix() -> None:
    raw = {"all": [LEAF, _leaf("contact.tags", "is_greater_than", "x")]}
    with pytest.raises(InvalidInput) as caught:
        parse_conditions(raw, field="rules.2.conditions")
    assert caught.value.field == "rules.2.conditions.all.1.operator"


VALID: list[tuple[str, Any]] = [
    ("nothing", None),
    ("an empty all", {"all": []}),
    ("as deep as allowed: a leaf", nest(LEAF, MAX_DEPTH)),
    ("as deep as allowed: a group", nest({"any": []}, MAX_DEPTH)),
    ("as many leaves as allowed", {"all": [{"all": [LEAF] * 50}, {"any": [LEAF] * (MAX_LEAVES - 50)}]}),
    ("the longest key", _leaf(CUSTOM_PREFIX + "k" * 64, "is_present")),
    ("a key with dots and quotes", _leaf(CUSTOM_PREFIX + "a.b'c\"", "equal_to", "x")),
    ("the longest text", _leaf("contact.name", "equal_to", "x" * MAX_TEXT)),
    ("the longest list", _leaf("contact.name", "in", ["x"] * MAX_LIST)),
    ("an empty text", _leaf("contact.name", "contains", "")),
    ("presence with a null value", _leaf("contact.name", "is_present", None)),
    ("a string compared with a custom attribute", _leaf(K, "equal_to", "80")),
    ("the largest number", _leaf(K, "is_greater_than", 999999999999999)),
    ("a change to null", _leaf(K, "attribute_changed", {"to": None})),
    (
        "a change between lists",
        _leaf("contact.tags", "attribute_changed", {"from": [], "to": [[1], "a", True]}),
    ),
]


@pytest.mark.parametrize("raw", [raw for _, raw in VALID], ids=[name for name, _ in VALID])
def test_valid_conditions_parse_and_compile(raw: Any) -> None:
    node = parse_conditions(raw)
    assert node == (ALWAYS if raw is None else parse_conditions(node.to_json()))
    predicate, params = compile_conditions(node)
    assert predicate.as_string().count("%s") == len(params)
    assert isinstance(node, Leaf | Group)
