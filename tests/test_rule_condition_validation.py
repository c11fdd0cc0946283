"""Rule conditions rejected or accepted before they are stored: invalid trees are rejected naming
the JSON path (under the caller's prefix), a NUL character anywhere is rejected, and valid trees parse and
compile."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from libs.common.contracts.limits import MAX_GROUP_CHILDREN
from libs.common.core.errors import InvalidInput
from libs.common.platform.conditions import (
    ALWAYS,
    CUSTOM_PREFIX,
    MAX_DEPTH,
    MAX_LEAVES,
    MAX_LIST,
    MAX_TEXT,
    Group,
    Leaf,
    compile_conditions,
    parse_conditions,
)
from tests.condition_helpers import (
    CHANGE_VALUES,
    KEYS,
    NUMBER,
    Pools,
    _leaf,
    condition_text,
    ends_of,
    leaves,
    trees,
)

NORMAL = Pools(
    text=condition_text,
    number=lambda attribute: NUMBER,
    change=lambda attribute: ends_of(st.sampled_from(CHANGE_VALUES)),
    key=st.sampled_from(KEYS),
)


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
    (
        "too many leaves, counted across groups",
        {"any": [{"all": [LEAF] * 40}] * 2 + [{"all": [LEAF] * (MAX_LEAVES - 79)}]},
        f"conditions.any.2.all.{MAX_LEAVES - 80}",
    ),
    ("a group of too many children", {"all": [LEAF] * (MAX_GROUP_CHILDREN + 1)}, "conditions.all"),
    (
        "too many nodes, groups counted",
        {"any": [{"all": [{"all": [LEAF]}, LEAF]}] * 50},
        "conditions.any.49.all.1",
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
