"""Conditions, as rules, sequence goals, exits and branches write them: a tree of ``all`` / ``any``
groups, nested to any depth, whose leaves are ``{attribute, operator, value}``; parsing and validation
against the attribute catalogue, and compilation of a tree into ONE parameterised SQL predicate.

    {"all": [{"attribute": "conversation.status", "operator": "equal_to", "value": "pending"},
             {"any": [{"attribute": "contact.tags", "operator": "contains", "value": "vip"},
                      {"attribute": "contact.attributes.score",
                       "operator": "is_greater_than", "value": 80}]}]}

The predicate is evaluated over a context its caller gives: an event ``t`` (its ``payload`` holds the
event's own message and ``changed`` set), a contact ``c``, a conversation ``v``, the contact's lead ``l``
and deal ``d`` (an event's: :data:`EVENT_CONTEXT`, after a rule's trigger row or a goal's event; a segment
or a contact's state without an event: :data:`SEGMENT_CONTEXT`). Identifiers come only from the catalogue
below, written as SQL here; every value a user gave (custom attribute keys included) is a bound
parameter. A predicate is never NULL: a leaf about a value that is absent is false, and a negative
operator is the negation of its positive one.

Text comparisons ignore ASCII case (``lower`` under the C collation: ``STOP`` matches ``stop``; other
letters compare as written).
"""

from __future__ import annotations

import functools
import math
import string
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from psycopg import sql
from psycopg.types.json import Jsonb

from libs.common.contracts.limits import MAX_CONDITION_NODES, MAX_GROUP_CHILDREN
from libs.common.core.errors import InvalidInput


@functools.cache
def _template(template: str) -> tuple[tuple[sql.SQL, bool], ...]:
    """A template's pieces, parsed once: each literal text and whether a ``{}`` field follows it."""
    pieces = []
    for text, name, _, _ in string.Formatter().parse(template):
        if name not in (None, ""):
            raise ValueError(f"only {{}} fields: {template!r}")
        pieces.append((sql.SQL(text), name is not None))
    return tuple(pieces)


def _format(template: str, *args: sql.Composable) -> sql.Composed:
    """``sql.SQL(template).format(*args)`` without parsing the template each time (conditions compile in
    the hot path of a rule set's load: a rule of a hundred leaves formats about a thousand templates)."""
    parts: list[sql.Composable] = []
    given = iter(args)
    for text, field in _template(template):
        parts.append(text)
        if field:
            parts.append(next(given))
    return sql.Composed(parts)


#: The events a condition may be about: what a rule fires on, a sequence's goal or exit is met by.
Event = Literal[
    "contact.created",
    "contact.tag_added",
    "contact.tag_removed",
    "contact.updated",
    "lead.created",
    "lead.status_changed",
    "deal.stage_changed",
    "conversation.created",
    "conversation.updated",
    "conversation.opened",
    "conversation.resolved",
    "message.created",
]


#: How deep a tree may nest, and how many leaves it may have.
MAX_DEPTH = 8
MAX_LEAVES = 100
#: Longest text value, and most values of an ``in`` list.
MAX_TEXT = 1000
MAX_LIST = 100

Kind = Literal["text", "number", "bool", "list", "custom", "changed"]

TEXT_OPERATORS = frozenset(
    {"equal_to", "not_equal_to", "contains", "does_not_contain", "starts_with", "in", "not_in"}
)
NUMBER_OPERATORS = frozenset({"equal_to", "not_equal_to", "is_greater_than", "is_less_than", "in", "not_in"})
BOOL_OPERATORS = frozenset({"equal_to", "not_equal_to"})
LIST_OPERATORS = frozenset({"equal_to", "not_equal_to", "contains", "does_not_contain", "in", "not_in"})
PRESENCE_OPERATORS = frozenset({"is_present", "is_not_present"})
OPERATORS = TEXT_OPERATORS | NUMBER_OPERATORS | LIST_OPERATORS | PRESENCE_OPERATORS | {"attribute_changed"}
#: Each negative operator and the positive one it negates.
NEGATIONS = {
    "not_equal_to": "equal_to",
    "does_not_contain": "contains",
    "not_in": "in",
    "is_not_present": "is_present",
}


@dataclass(frozen=True)
class Attribute:
    name: str
    kind: Kind
    #: The attribute's value over the context (for ``custom``: the contact's ``attributes`` object).
    expression: sql.Composable
    description: str


def _attr(name: str, kind: Kind, expression: str, description: str) -> Attribute:
    return Attribute(name, kind, sql.SQL(expression), description)


#: What one change added or removed (a change that adds several tags is one event: each rule runs once for
#: it and tests what it added): the attribute, its key in the trigger's payload, its description and the
#: rule events that carry it.
EVENT_LISTS: dict[str, tuple[str, str, frozenset[str]]] = {
    "event.tags_added": (
        "tags_added",
        "the tags the change added",
        frozenset({"contact.tag_added", "contact.tag_removed"}),
    ),
    "event.tags_removed": (
        "tags_removed",
        "the tags the change removed",
        frozenset({"contact.tag_added", "contact.tag_removed"}),
    ),
    "event.labels_added": (
        "labels_added",
        "the labels the change added",
        frozenset({"conversation.updated"}),
    ),
    "event.labels_removed": (
        "labels_removed",
        "the labels the change removed",
        frozenset({"conversation.updated"}),
    ),
}


def _payload_list(key: str) -> str:
    """A list of the trigger's payload as text[] (empty when the event has none, or not as a list)."""
    value = f"(t.payload -> '{key}')"
    return (
        f"ARRAY(SELECT jsonb_array_elements_text(CASE WHEN jsonb_typeof({value}) = 'array' THEN {value}"
        " ELSE '[]'::jsonb END))"
    )


#: The catalogue: every attribute a condition may name (``contact.attributes.<key>`` for custom ones).
ATTRIBUTES: dict[str, Attribute] = {
    a.name: a
    for a in (
        _attr("contact.name", "text", "c.name", "the contact's name"),
        _attr("contact.phone", "text", "c.phone", "the contact's phone (E.164)"),
        _attr("contact.timezone", "text", "c.timezone", "the contact's IANA time zone"),
        _attr("contact.consent", "text", "c.consent", "unknown, granted or revoked"),
        _attr("contact.opted_out", "bool", "(c.opted_out_at IS NOT NULL)", "whether the contact opted out"),
        _attr("contact.tags", "list", "c.tags", "the contact's tags"),
        _attr("conversation.status", "text", "v.status", "open, pending, snoozed or resolved"),
        _attr("conversation.priority", "text", "v.priority", "low, medium, high or urgent"),
        _attr("conversation.labels", "list", "v.labels", "the conversation's labels"),
        _attr("conversation.assignee", "text", "v.assignee", "the assigned agent"),
        _attr("conversation.team", "text", "v.team", "the assigned team"),
        _attr("conversation.inbox", "text", "v.inbox_thread", "the inbox (thread) the conversation is in"),
        _attr("conversation.number", "text", "(v.number_id::text)", "the id of the conversation's number"),
        _attr("message.type", "text", "(t.payload #>> '{message,type}')", "incoming or outgoing"),
        _attr("message.content", "text", "(t.payload #>> '{message,content}')", "the event's message text"),
        _attr("lead.status", "text", "l.status", "the status of the event's lead (else the newest)"),
        _attr("deal.stage", "text", "d.stage", "the stage of the event's deal (else the newest)"),
        _attr("changed", "changed", "(t.payload -> 'changed')", "the attributes the event changed"),
        *(
            _attr(name, "list", _payload_list(key), description)
            for name, (key, description, _) in EVENT_LISTS.items()
        ),
    )
}
CUSTOM_PREFIX = "contact.attributes."
_CUSTOM = _attr("contact.attributes", "custom", "c.attributes", "the contact's custom attributes")

#: The context of an event ``t`` (selected by the caller: a rule's trigger row, or a row of parameters with
#: ``project_id``, ``contact_id``, ``conversation_id`` and ``payload``): its contact ``c`` (none once erased:
#: no rule or goal acts on an erased contact), conversation ``v``, the contact's lead ``l`` and deal ``d``
#: (the event's own, else the newest).
EVENT_CONTEXT = sql.SQL(
    """JOIN contacts c ON c.project_id = t.project_id AND c.id = t.contact_id AND c.erased_at IS NULL
LEFT JOIN conversations v ON v.project_id = t.project_id AND v.id = t.conversation_id
LEFT JOIN LATERAL (
    SELECT status FROM leads
    WHERE leads.project_id = c.project_id AND leads.contact_id = c.id
    ORDER BY leads.id = (t.payload ->> 'lead_id')::uuid DESC NULLS LAST, leads.created_at DESC, leads.id
    LIMIT 1
) l ON true
LEFT JOIN LATERAL (
    SELECT stage FROM deals
    WHERE deals.project_id = c.project_id AND deals.contact_id = c.id
    ORDER BY deals.id = (t.payload ->> 'deal_id')::uuid DESC NULLS LAST, deals.updated_at DESC, deals.id
    LIMIT 1
) d ON true"""
)


#: FROM clause of a segment (bulk enrollment): every contact ``c`` with its newest conversation ``v``, lead
#: ``l`` and deal ``d``; there is no event, so ``t`` has an empty payload (event attributes are refused).
SEGMENT_CONTEXT = sql.SQL(
    """contacts c
CROSS JOIN (SELECT '{}'::jsonb AS payload) t
LEFT JOIN LATERAL (
    SELECT * FROM conversations
    WHERE conversations.project_id = c.project_id AND conversations.contact_id = c.id
    ORDER BY created_at DESC, id LIMIT 1
) v ON true
LEFT JOIN LATERAL (
    SELECT status FROM leads
    WHERE leads.project_id = c.project_id AND leads.contact_id = c.id
    ORDER BY leads.created_at DESC, leads.id LIMIT 1
) l ON true
LEFT JOIN LATERAL (
    SELECT stage FROM deals
    WHERE deals.project_id = c.project_id AND deals.contact_id = c.id
    ORDER BY deals.updated_at DESC, deals.id LIMIT 1
) d ON true"""
)
#: Attributes only an event has: a segment may not use them.
EVENT_ATTRIBUTES = frozenset({"message.type", "message.content", "changed", *EVENT_LISTS})


# --- the tree ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    attribute: str
    operator: str
    value: Any = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attribute": self.attribute, "operator": self.operator}
        if self.value is not None:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class Group:
    kind: Literal["all", "any"]
    children: tuple[Node, ...]

    def to_json(self) -> dict[str, Any]:
        return {self.kind: [child.to_json() for child in self.children]}


Node = Leaf | Group

#: The tree that always holds.
ALWAYS = Group("all", ())


def parse_conditions(raw: Any, field: str = "conditions", *, stored: bool = False) -> Node:
    """A validated tree from JSON-like data (None: always true); InvalidInput names the JSON path. A tree
    ``stored`` before its limits (:data:`MAX_CONDITION_NODES`, :data:`MAX_GROUP_CHILDREN`) keeps working
    (they are enforced when a tree is saved)."""
    if raw is None:
        return ALWAYS
    counts = _Counts(bounded=not stored)
    return _parse(raw, field, 0, counts)


def parse_segment(raw: Any, field: str = "segment") -> Node:
    """A segment: a condition tree about contacts only (no event attributes, no attribute_changed)."""
    node = parse_conditions(raw, field)
    for path, leaf in _leaves(node, field):
        if leaf.attribute in EVENT_ATTRIBUTES:
            raise InvalidInput(
                f"a segment has no event: {leaf.attribute} cannot be used", field=f"{path}.attribute"
            )
        if leaf.operator == "attribute_changed":
            raise InvalidInput(
                "a segment has no event: attribute_changed cannot be used", field=f"{path}.operator"
            )
    return node


def check_event_fields(node: Node, event: str, field: str = "conditions") -> None:
    """A rule's conditions name only the event fields its event carries (``event.tags_added`` with
    ``contact.tag_added``, say): InvalidInput names the leaf's attribute."""
    for path, leaf in _leaves(node, field):
        carried = EVENT_LISTS.get(leaf.attribute)
        if carried is not None and event not in carried[2]:
            raise InvalidInput(
                f"{leaf.attribute} is a field of {' and '.join(sorted(carried[2]))} events, not of {event}",
                field=f"{path}.attribute",
            )


def _leaves(node: Node, path: str) -> list[tuple[str, Leaf]]:
    if isinstance(node, Leaf):
        return [(path, node)]
    return [
        found for i, child in enumerate(node.children) for found in _leaves(child, f"{path}.{node.kind}.{i}")
    ]


class _Counts:
    """What a tree's walk has seen so far: it stops at the first node over a limit."""

    def __init__(self, bounded: bool) -> None:
        self.bounded = bounded
        self.nodes = 0
        self.leaves = 0


def _parse(raw: Any, field: str, depth: int, counts: _Counts) -> Node:
    if not isinstance(raw, dict):
        raise InvalidInput("a condition is an object: {all: [...]}, {any: [...]} or a leaf", field=field)
    if depth > MAX_DEPTH:
        raise InvalidInput(f"conditions nest at most {MAX_DEPTH} groups deep", field=field)
    counts.nodes += 1
    if counts.bounded and counts.nodes > MAX_CONDITION_NODES:
        raise InvalidInput(
            f"conditions have at most {MAX_CONDITION_NODES} nodes (groups and leaves together)", field=field
        )
    groups = [key for key in ("all", "any") if key in raw]
    if groups:
        kind = groups[0]
        if len(raw) != 1:
            raise InvalidInput(f"a group has only its {kind!r} list", field=field)
        children = raw[kind]
        if not isinstance(children, list):
            raise InvalidInput(f"{kind} is a list of conditions", field=f"{field}.{kind}")
        if (
            counts.bounded and len(children) > MAX_GROUP_CHILDREN
        ):  # before walking them: a huge flat list is refused at once
            raise InvalidInput(
                f"a group has at most {MAX_GROUP_CHILDREN} conditions", field=f"{field}.{kind}"
            )
        return Group(
            kind,  # type: ignore[arg-type]
            tuple(
                _parse(child, f"{field}.{kind}.{i}", depth + 1, counts) for i, child in enumerate(children)
            ),
        )
    counts.leaves += 1
    if counts.leaves > MAX_LEAVES:
        raise InvalidInput(f"conditions have at most {MAX_LEAVES} leaves", field=field)
    unknown = set(raw) - {"attribute", "operator", "value"}
    if unknown:
        raise InvalidInput(f"unknown field {sorted(unknown)[0]!r}", field=f"{field}.{sorted(unknown)[0]}")
    return validate_leaf(raw.get("attribute"), raw.get("operator"), raw.get("value"), field)


def attribute_of(name: Any, field: str) -> Attribute:
    """The catalogue's attribute called ``name`` (a custom one is typed by the value it is compared with)."""
    if not isinstance(name, str):
        raise InvalidInput("attribute is required (a name such as conversation.status)", field=field)
    if name.startswith(CUSTOM_PREFIX):
        key = name.removeprefix(CUSTOM_PREFIX)
        if not 1 <= len(key) <= 64 or "\x00" in key:
            raise InvalidInput("a custom attribute's key has 1 to 64 characters", field=field)
        return _CUSTOM
    found = ATTRIBUTES.get(name)
    if found is None:
        raise InvalidInput(f"unknown attribute {name!r}", field=field)
    return found


def validate_leaf(attribute: Any, operator: Any, value: Any, field: str) -> Leaf:
    found = attribute_of(attribute, f"{field}.attribute")
    if not isinstance(operator, str) or operator not in OPERATORS:
        raise InvalidInput(f"unknown operator {operator!r}", field=f"{field}.operator")
    where = f"{field}.value"
    if operator in PRESENCE_OPERATORS:
        if value is not None:
            raise InvalidInput(f"{operator} takes no value", field=where)
        return Leaf(attribute, operator)
    if operator == "attribute_changed":
        if found.kind == "changed":
            raise InvalidInput(
                "attribute_changed names the attribute that changed", field=f"{field}.attribute"
            )
        return Leaf(attribute, operator, _changed_value(value, where))
    kind = _custom_kind(value, where) if found.kind == "custom" else found.kind
    allowed = {
        "text": TEXT_OPERATORS,
        "number": NUMBER_OPERATORS,
        "bool": BOOL_OPERATORS,
        "list": LIST_OPERATORS,
        "changed": frozenset({"contains", "does_not_contain"}),
    }[kind]
    if operator not in allowed:
        raise InvalidInput(
            f"{operator} does not apply to {attribute} ({kind}); use one of {', '.join(sorted(allowed))}",
            field=f"{field}.operator",
        )
    if operator in ("in", "not_in"):
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_LIST:
            raise InvalidInput(f"{operator} takes a list of 1 to {MAX_LIST} values", field=where)
        item_kind: Kind = "number" if kind == "number" else "text"
        return Leaf(
            attribute, operator, [_scalar(item, item_kind, f"{where}.{i}") for i, item in enumerate(value)]
        )
    return Leaf(attribute, operator, _scalar(value, "text" if kind in ("list", "changed") else kind, where))


def _custom_kind(value: Any, where: str) -> Kind:
    """A custom attribute compares as the type of the value it is given (a list: of its items)."""
    sample = value[0] if isinstance(value, list) and value else value
    if isinstance(sample, bool):
        return "bool"
    if isinstance(sample, int | float):
        return "number"
    if isinstance(sample, str):
        return "text"
    raise InvalidInput("a custom attribute is compared with a string, a number or a boolean", field=where)


def _scalar(value: Any, kind: Kind, where: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise InvalidInput("the value must be true or false", field=where)
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidInput("the value must be a number", field=where)
        if abs(value) >= 1e15:
            raise InvalidInput("the value must be below 10^15 in size", field=where)
        return value
    if not isinstance(value, str):
        raise InvalidInput("the value must be a string", field=where)
    if len(value) > MAX_TEXT:
        raise InvalidInput(f"the value has at most {MAX_TEXT} characters", field=where)
    if "\x00" in value:
        raise InvalidInput("the value must not contain NUL characters", field=where)
    return value


def _changed_value(value: Any, where: str) -> dict[str, Any]:
    """``{from, to}``: either may be left out (any value); each is a JSON value the attribute had."""
    if not isinstance(value, dict) or not value or set(value) - {"from", "to"}:
        raise InvalidInput("attribute_changed takes {from, to} (one of them at least)", field=where)
    for end, item in value.items():
        _json(item, f"{where}.{end}")
    return value


def _json(value: Any, where: str) -> None:
    if isinstance(value, str):
        _scalar(value, "text", where)
    elif isinstance(value, list):
        if len(value) > MAX_LIST:
            raise InvalidInput(f"at most {MAX_LIST} values", field=where)
        for i, item in enumerate(value):
            _json(item, f"{where}.{i}")
    elif isinstance(value, dict):
        raise InvalidInput("from and to are strings, numbers, booleans, lists or null", field=where)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _scalar(value, "number", where)


def attributes_in(node: Node) -> set[str]:
    """Every attribute a tree names."""
    if isinstance(node, Leaf):
        return {node.attribute}
    return set().union(*(attributes_in(child) for child in node.children)) if node.children else set()


# --- compilation -------------------------------------------------------------------------------------------


def compile_conditions(node: Node) -> tuple[sql.Composable, list[Any]]:
    """ONE SQL predicate (never NULL) over the context and its parameters, in placeholder order."""
    params: list[Any] = []
    return _compile(node, params), params


def _compile(node: Node, params: list[Any]) -> sql.Composable:
    if isinstance(node, Group):
        if not node.children:
            return sql.SQL("true" if node.kind == "all" else "false")
        joiner = sql.SQL(" AND " if node.kind == "all" else " OR ")
        return _format("({})", joiner.join(_compile(child, params) for child in node.children))
    negated = NEGATIONS.get(node.operator)
    if negated is not None:
        return _format("(NOT {})", _leaf(Leaf(node.attribute, negated, node.value), params))
    return _leaf(node, params)


def value_of(leaf: Leaf) -> tuple[sql.Composable, list[Any]]:
    """The value a leaf is about over the context, as jsonb (NULL: absent), and its parameters: the
    attribute's own expression (a custom attribute's stored JSON value, whatever its type). For
    ``attribute_changed`` it is the event's change of the attribute (``{"from": ..., "to": ...}``, NULL when
    the event did not change it): what that operator compares."""
    params: list[Any] = []
    if leaf.operator == "attribute_changed":
        return _format("(t.payload -> 'changed' -> {})", _text(params, leaf.attribute)), params
    if leaf.attribute.startswith(CUSTOM_PREFIX):
        return _custom(params, leaf.attribute.removeprefix(CUSTOM_PREFIX)), params
    return _format("to_jsonb({})", attribute_of(leaf.attribute, "attribute").expression), params


def _bind(params: list[Any], value: Any) -> sql.Composable:
    params.append(value)
    return sql.Placeholder()


def _text(params: list[Any], value: str) -> sql.Composable:
    return _format("{}::text", _bind(params, value))


def _folded_list(params: list[Any], values: list[str]) -> sql.Composable:
    """The values of an ``in`` list, folded like the text they are compared with."""
    return _format("SELECT {} FROM unnest({}::text[]) AS u", _fold(sql.SQL("u")), _bind(params, values))


def _fold(expression: sql.Composable) -> sql.Composable:
    """ASCII-case-insensitive text: ``lower`` under the C collation lowers A-Z only, everywhere alike."""
    return _format('lower(({}) COLLATE "C")', expression)


def _leaf(leaf: Leaf, params: list[Any]) -> sql.Composable:
    """A positive leaf: true, or false when it does not hold or the value is absent (never NULL)."""
    attribute = attribute_of(leaf.attribute, "attribute")
    op, value = leaf.operator, leaf.value
    if op == "attribute_changed":
        return _changed(leaf, params)
    expression = attribute.expression
    kind = attribute.kind
    if kind == "custom":
        key = leaf.attribute.removeprefix(CUSTOM_PREFIX)
        if op == "is_present":
            return _format(
                "coalesce(jsonb_typeof({}) <> 'null' AND {} <> '\"\"'::jsonb, false)",
                _custom(params, key),
                _custom(params, key),
            )
        kind = _custom_kind(value, "value")
        expression = _typed_json(params, key, kind)
    if op == "is_present":
        shape = {
            "list": sql.SQL("cardinality({}) > 0"),
            "changed": sql.SQL("{} <> '{{}}'::jsonb"),
            "text": sql.SQL("{} <> ''"),
        }.get(kind, sql.SQL("{} IS NOT NULL"))
        return _format("coalesce({}, false)", shape.format(expression))
    if kind == "changed":  # contains: the event changed that attribute
        return _format("coalesce({} ? {}::text, false)", expression, _bind(params, value))
    test: sql.Composable
    if kind == "list":
        if op == "in":
            wanted = _folded_list(params, value)
        else:  # contains (equal_to means the same for a list: one of its items is the value)
            wanted = _format("SELECT {}", _fold(_text(params, value)))
        return _format(
            "EXISTS (SELECT 1 FROM unnest({}) AS e WHERE {} IN ({}))", expression, _fold(sql.SQL("e")), wanted
        )
    if kind == "number":
        comparison = {"equal_to": "=", "is_greater_than": ">", "is_less_than": "<"}
        if op == "in":
            numbers = [Decimal(repr(item)) for item in value]
            test = _format("{} = ANY ({}::numeric[])", expression, _bind(params, numbers))
        else:
            test = _format(
                "{} {} {}::numeric", expression, sql.SQL(comparison[op]), _bind(params, Decimal(repr(value)))
            )
        return _format("coalesce({}, false)", test)
    if kind == "bool":
        return _format("coalesce({} = {}::boolean, false)", expression, _bind(params, value))
    # text
    folded = _fold(expression)
    if op == "in":
        test = _format("{} = ANY ({})", folded, _folded_list(params, value))
    elif op == "contains":
        test = _format("strpos({}, {}) > 0", folded, _fold(_text(params, value)))
    elif op == "starts_with":
        test = _format("starts_with({}, {})", folded, _fold(_text(params, value)))
    else:  # equal_to
        test = _format("{} = {}", folded, _fold(_text(params, value)))
    return _format("coalesce({}, false)", test)


def _custom(params: list[Any], key: str) -> sql.Composable:
    """A custom attribute's JSON value (each use binds its key: a placeholder stands for one parameter)."""
    return _format("(c.attributes -> {})", _text(params, key))


def _typed_json(params: list[Any], key: str, kind: Kind) -> sql.Composable:
    """A custom attribute's value as ``kind``, or NULL when it holds another type."""
    cast = {"number": "numeric", "bool": "boolean", "text": "text"}[kind]
    json_type = {"number": "number", "bool": "boolean", "text": "string"}[kind]
    return _format(
        "(CASE WHEN jsonb_typeof({}) = {} THEN ({} #>> '{{}}')::{} END)",
        _custom(params, key),
        sql.Literal(json_type),
        _custom(params, key),
        sql.SQL(cast),
    )


def _changed(leaf: Leaf, params: list[Any]) -> sql.Composable:
    """The event changed the attribute, from and to the values given (each end compared as JSON)."""

    def change() -> sql.Composable:  # each use binds the attribute's name
        return _format("(t.payload -> 'changed' -> {})", _text(params, leaf.attribute))

    tests = [_format("{} IS NOT NULL", change())]
    for end in ("from", "to"):
        if end in leaf.value:
            tests.append(
                _format(
                    "{} -> {} = {}::jsonb", change(), sql.Literal(end), _bind(params, Jsonb(leaf.value[end]))
                )
            )
    return _format("coalesce({}, false)", sql.SQL(" AND ").join(tests))
