"""Rule conditions: the ONE SQL predicate a tree compiles to agrees with a plain-Python reading of the
documented semantics, over random trees and random contexts stored as real rows; so does a rule's dry run,
node by node (its root is what ``match`` says, each group's result its children's, each leaf's value the
context's); no user value (custom attribute keys included) ever reaches the SQL text; invalid trees are
rejected naming the JSON path.

The evaluator below is written from what ``libs.common.platform.conditions`` documents (its docstring and the
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

import dataclasses
import string
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, LiteralString
from unittest.mock import patch

import msgspec
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from psycopg import Connection, sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.platform.conditions import (
    ATTRIBUTES,
    CUSTOM_PREFIX,
    MAX_LIST,
    Group,
    Leaf,
    Node,
    compile_conditions,
    parse_conditions,
)
from libs.common.rules import matching
from libs.common.rules import trace as trace_module
from libs.common.rules.dry_run import DryRunRequest, EventData, dry_run
from libs.common.rules.matching import CONTEXT, inline, match, send_match
from libs.common.rules.trace import (
    TRACED_NODES,
    ConditionResult,
    GroupResult,
    Recorded,
    expand,
    record,
    record_all,
    trace,
    traced_match,
)
from libs.common.rules.triggers import insert_trigger
from tests.condition_helpers import (
    CHANGE_VALUES,
    CHANGED_KEYS,
    CUSTOM_TEXT,
    HOSTILE,
    KEYS,
    KINDS,
    NOTHING,
    NUMBER,
    NUMBER_IDS,
    POOL_THREADS_USE_RANDOM,
    QUICK,
    VOCAB,
    Pools,
    _leaf,
    choices,
    condition_text,
    ends_of,
    json_kind,
    leaf_of,
    leaves,
    make_leaf,
    number,
    pieces,
    recased,
    trees,
    words,
)
from tests.conftest import Project

T0 = datetime(2030, 1, 1, tzinfo=UTC)

# --- the evaluator: the documented semantics in plain Python -----------------------------------------------

NEGATIVE = {
    "not_equal_to": "equal_to",
    "does_not_contain": "contains",
    "not_in": "in",
    "is_not_present": "is_present",
}
ASCII_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

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
    #: What the change added and removed (``tags_added``, ...: a key absent is an empty list).
    event_lists: dict[str, list[str | None]]

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.event_lists)
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
    if name.startswith("event."):
        return ctx.event_lists.get(name.removeprefix("event."), [])
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
    # the triggers service matches with the values written in: the same answers
    literals = [inline(conn, *compile_conditions(node)) for node in nodes]
    project_id = _one(conn, "SELECT project_id FROM followup_triggers WHERE id = %s", (trigger_id,))
    assert match(conn, project_id, [trigger_id], literals) == {trigger_id: list(found[0][0])}
    return list(found[0][0])


# --- the strategies ----------------------------------------------------------------------------------------


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
    event_lists=st.fixed_dictionaries(
        {},
        optional={
            name.removeprefix("event."): items(name)
            for name in (
                "event.tags_added",
                "event.tags_removed",
                "event.labels_added",
                "event.labels_removed",
            )
        },
    ),
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


# --- the differential test ---------------------------------------------------------------------------------


def test_the_evaluator_knows_every_attribute_of_the_catalogue() -> None:
    assert set(KINDS) == set(ATTRIBUTES)


# no shrinking: an example is a few hundred leaves, each alone already; a failure names the leaves that
# disagree, where shrinking them would take minutes. About 15 s on a quiet 2-core machine; a loaded one
# (the suite's other workers, other processes) was seen to take 121 s, past the default timeout
@pytest.mark.timeout(600)
@POOL_THREADS_USE_RANDOM
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
    event_lists={"tags_added": ["Demo-Booked", "vip"]},
)


SEMANTICS: list[tuple[Any, bool]] = [
    (None, True),
    (_leaf("event.tags_added", "contains", "demo-booked"), True),
    (_leaf("event.tags_added", "contains", "lead"), False),  # the contact has it; this change did not add it
    (_leaf("event.tags_removed", "is_present"), False),  # absent from the payload: an empty list
    (_leaf("event.labels_added", "does_not_contain", "urgent"), True),
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


# --- the trace: a dry run's, and what a rule run keeps ------------------------------------------------------
#
# A trace (libs.common.rules.trace: a dry run's, a rule run's, a delayed execution's) reads every node of a
# rule's tree compiled alone, and each leaf's value, over one trigger's context. Its results are never NULL:
# the compiler wraps each leaf in coalesce(..., false), negates a never-NULL positive, and joins never-NULL
# children with AND / OR (an empty all is true, an empty any false); so every result is a boolean and each
# group's is exactly all / any of its children's.


def expected_value(leaf: Leaf, ctx: Context) -> Any:
    """What a dry run shows as the value a leaf compared (None: absent), read from the context."""
    if leaf.operator == "attribute_changed":
        return (ctx.changed or {}).get(leaf.attribute)
    if leaf.attribute.startswith(CUSTOM_PREFIX):
        return ctx.attributes.get(leaf.attribute.removeprefix(CUSTOM_PREFIX))
    return attribute_value(ctx, leaf.attribute)


def check_trace(traced: ConditionResult, node: Node, ctx: Context) -> list[str]:
    """What is wrong with a trace of ``node``: a result that is not a boolean, a group whose result is not
    its children's, a result the evaluator disagrees with, or a value that is not the context's."""
    wrong = []
    if type(traced.result) is not bool:
        wrong.append(f"{traced.path}: {traced.result!r} is not a boolean")
    if traced.result is not holds(node, ctx):
        wrong.append(f"{traced.path} {node.to_json()}: trace {traced.result}, expected {holds(node, ctx)}")
    if isinstance(traced, GroupResult):
        assert isinstance(node, Group) and traced.kind == node.kind
        results = [child.result for child in traced.children]
        if traced.result is not (all(results) if traced.kind == "all" else any(results)):
            wrong.append(f"{traced.path}: {traced.kind} of {results} is not {traced.result}")
        for child, child_node in zip(traced.children, node.children, strict=True):
            wrong += check_trace(child, child_node, ctx)
    else:
        assert isinstance(node, Leaf)
        assert (traced.attribute, traced.operator, traced.value) == (
            node.attribute,
            node.operator,
            node.value,
        )
        if not json_equal(traced.actual, expected := expected_value(node, ctx)):
            wrong.append(f"{traced.path} {node.to_json()}: value {traced.actual!r}, expected {expected!r}")
    return wrong


def as_event(ctx: Context) -> tuple[Context, EventData]:
    """The context as a dry run's request can give it (an event's data is well-formed: a message of a known
    type, changes with from / to, lists of strings, ids), and that data."""
    message = ctx.message if (ctx.message or {}).get("type") in ("incoming", "outgoing") else None
    changed = {
        name: entry
        for name, entry in (ctx.changed or {}).items()
        if isinstance(entry, dict) and set(entry) <= {"from", "to"}
    }
    kept = dataclasses.replace(
        ctx,
        message=message
        if message is None
        else {"type": message["type"], "content": message.get("content") or ""},
        changed=changed if ctx.changed is not None else None,
        event_lists={
            key: [item for item in items if item is not None] for key, items in ctx.event_lists.items()
        },
        lead_ref="absent" if ctx.lead_ref == "null" else ctx.lead_ref,
        deal_ref="absent" if ctx.deal_ref == "null" else ctx.deal_ref,
    )
    return kept, msgspec.convert(kept.payload(), EventData)


def stored_rule(conn: Connection[Any], project_id: uuid.UUID, event: str, raw: Any) -> uuid.UUID:
    """A rule of ``event`` with the conditions ``raw`` as stored (a tree drawn for any event)."""
    rule_id: uuid.UUID = _one(
        conn,
        "INSERT INTO rules (project_id, name, event, conditions, actions) VALUES (%s, 'drawn', %s, %s, %s)"
        " RETURNING id",
        (project_id, event, Jsonb(raw), Jsonb([{"type": "add_contact_tag", "tags": ["x"]}])),
    )
    return rule_id


@st.composite
def traced_examples(draw: st.DrawFn) -> tuple[Context, list[Any]]:
    """A context, a group with a leaf about every attribute (custom: each key the context has, and one
    more), and random trees about it."""
    ctx = draw(CONTEXTS)
    pools = context_pools(ctx)
    custom = [*ctx.attributes, draw(st.sampled_from(KEYS))]
    attributes = unique([*KINDS, *(CUSTOM_PREFIX + key for key in custom), *changed_attributes(ctx)])
    probes = {draw(st.sampled_from(["all", "any"])): [draw(leaf_of(name, pools)) for name in attributes]}
    return ctx, [probes, *draw(st.lists(trees(leaves(pools)), min_size=1, max_size=8))]


@pytest.mark.timeout(600)
@POOL_THREADS_USE_RANDOM
@settings(QUICK, max_examples=40, phases=[Phase.explicit, Phase.generate])
@given(example=traced_examples())
def test_the_dry_run_agrees_with_match_and_the_documented_semantics(
    pool: ConnectionPool, project: Project, example: tuple[Context, list[Any]]
) -> None:
    ctx, raws = example
    kept, data = as_event(ctx)
    wrong = []
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        trigger_id = store(conn, project.id, ctx)
        contact_id, conversation_id = conn.execute(
            "SELECT contact_id, conversation_id FROM followup_triggers WHERE id = %s", (trigger_id,)
        ).fetchone() or (None, None)
        # the same event as the dry run's request gives it, recorded as a trigger of its own
        twin = insert_trigger(
            conn,
            project.id,
            "message.created",
            contact_id=contact_id,
            conversation_id=conversation_id,
            payload=msgspec.to_builtins(data),
            now=T0,
        ).trigger_id
        event = "message.created" if conversation_id is not None else "contact.tag_added"
        for raw in raws:
            node = parse_conditions(raw)
            literal = inline(conn, *compile_conditions(node))
            # the trace over a stored trigger (any payload): each node, each value, the root as match says
            traced = trace(conn, project.id, node, trigger_id)
            assert traced is not None
            assert traced.result is match(conn, project.id, [trigger_id], [literal])[trigger_id][0]
            wrong += check_trace(traced, node, ctx)
            # what a rule run keeps of it (record), stored as jsonb and read back (expand): the same tree
            recorded = record(conn, project.id, node, [trigger_id])[trigger_id]
            kept_json = _one(conn, "SELECT %s::jsonb", (Jsonb(msgspec.to_builtins(recorded)),))
            wrong += check_trace(expand(msgspec.convert(kept_json, Recorded)), node, ctx)
            # the whole dry run over a rule with this tree: the root as match says for the same event
            rule_id = stored_rule(conn, project.id, event, raw)
            request = DryRunRequest(contact_id=contact_id, conversation_id=conversation_id, event=data)
            answer = dry_run(conn, project.id, rule_id, request, now=T0)
            verdict = match(conn, project.id, [twin], [literal])[twin][0]
            assert answer.matched is answer.conditions.result is verdict
            wrong += check_trace(answer.conditions, node, kept)
        # the trees recorded together (as a batch's matched rules are), each over its own triggers (one over
        # none), in one statement and in one each: what each tree recorded alone
        nodes = [parse_conditions(raw) for raw in raws]
        wanted = [(node, [trigger_id, twin][: i % 3]) for i, node in enumerate(nodes)]
        alone = [record(conn, project.id, node, ids) for node, ids in wanted]
        assert record_all(conn, project.id, wanted) == alone
        with patch.object(matching, "MAX_STATEMENT_CHARS", 1):
            assert record_all(conn, project.id, wanted) == alone
        # the triggers service's match, which traces as it matches (every tree in one statement, or one
        # each): NULL where a tree does not hold, else the trace that record keeps (a tree of more than
        # TRACED_NODES nodes: an empty array, its trace read apart; every tree carries its own under a
        # bound none reaches)
        both = [trigger_id, twin]
        expected = [record(conn, project.id, node, both) for node in nodes]
        for bound, chars in [(TRACED_NODES, matching.MAX_STATEMENT_CHARS), (10**6, 1), (10**6, 10**6)]:
            with patch.object(trace_module, "TRACED_NODES", bound):
                columns = [traced_match(conn, node) for node in nodes]
                with patch.object(matching, "MAX_STATEMENT_CHARS", chars):
                    found = matching.matched(
                        both, send_match(conn, project.id, both, [c.column for c in columns])
                    )
                for recorded_by, column, k in zip(expected, columns, range(len(nodes)), strict=True):
                    assert column.carries_trace is (column.nodes <= bound)
                    for one in both:
                        value = found[one][k]
                        if not recorded_by[one].holds:
                            assert value is None
                        elif column.carries_trace:
                            assert value is not None and column.recorded(value) == recorded_by[one]
                        else:
                            assert (value, column.recorded(value)) == ([], None)
    assert not wrong, "\n".join([f"{len(wrong)} disagreements:", *wrong[:20]])
