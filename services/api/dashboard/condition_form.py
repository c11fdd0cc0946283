"""The condition builder of the rule form: groups ``all`` / ``any`` nested to any depth, with leaves
(an attribute, an operator, a typed value), read from a posted form into the API's JSON and back, and a
rule's conditions in one line.

A group's children are ``<group>.<kind>.<i>`` (the root group is ``conditions`` in the rule form; a form with
several trees names each root by its field, such as a branch path's ``paths.0.when``), a leaf's inputs
``<leaf>.attribute``, ``<leaf>.operator`` and ``<leaf>.value``. A group's kind is an input of its own
(``<group>.kind``): the names a form was drawn with may hold an old kind, so a posted form is read by the
positions in the names (:func:`group_from_form`), and drawn again with the kinds chosen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from libs.common.contracts.labels import label
from libs.common.platform.conditions import ATTRIBUTES, CUSTOM_PREFIX, EVENT_ATTRIBUTES
from services.api.dashboard.forms import Form, FormErrors, comma_list

#: The attribute select of a leaf: the catalogue, then a custom attribute (its key typed beside it).
ATTRIBUTE_CHOICES = [
    ("", "choose…"),
    *[(name, name) for name in ATTRIBUTES],
    ("custom", "contact.attributes.<key>"),
]
OPERATOR_CHOICES = [
    (op, op.replace("_", " "))
    for op in (
        "equal_to",
        "not_equal_to",
        "contains",
        "does_not_contain",
        "starts_with",
        "is_greater_than",
        "is_less_than",
        "in",
        "not_in",
        "is_present",
        "is_not_present",
        "attribute_changed",
    )
]
#: The attributes a segment's conditions may name (a branch path's: there is no event).
SEGMENT_ATTRIBUTE_CHOICES = [choice for choice in ATTRIBUTE_CHOICES if choice[0] not in EVENT_ATTRIBUTES]
SEGMENT_OPERATOR_CHOICES = [choice for choice in OPERATOR_CHOICES if choice[0] != "attribute_changed"]
VALUE_TYPES = [("text", "text"), ("number", "number"), ("boolean", "true / false")]


@dataclass
class Leaf:
    attribute: str = ""
    custom_key: str = ""
    operator: str = "equal_to"
    value: str = ""
    value_type: str = "text"
    changed_from: str = ""


@dataclass
class Group:
    kind: str = "all"
    children: list[Leaf | Group] = field(default_factory=list)


def path_of(name: str, root: str = "conditions") -> tuple[int, ...] | None:
    """The child indexes a node's name walks from the tree's ``root`` (``conditions.all.1.any.0`` ->
    ``(1, 0)``)."""
    if name != root and not name.startswith(root + "."):
        return None
    path: list[int] = []
    rest = name[len(root) :].lstrip(".").split(".") if name != root else []
    while len(rest) >= 2 and rest[0] in ("all", "any") and rest[1].isdigit():
        path.append(int(rest[1]))
        rest = rest[2:]
    return tuple(path) if not rest else None


def node_at(root: Group, path: tuple[int, ...]) -> Leaf | Group | None:
    node: Leaf | Group = root
    for index in path:
        if not isinstance(node, Group) or index >= len(node.children):
            return None
        node = node.children[index]
    return node


def group_from_form(
    form: Form, root: str = "conditions"
) -> tuple[Group, dict[tuple[int, ...], tuple[int, ...]]]:
    """The tree a posted form describes under ``root`` (by the positions in the names; see the module), and
    where each posted node went in it (a gap in the posted positions closes up)."""
    fields: dict[tuple[int, ...], dict[str, str]] = {}
    for name, value in form.items(root + ".").items():
        head, _, last = name.rpartition(".")
        path = path_of(head, root)
        if path is not None:
            fields.setdefault(path, {})[last] = value
    top = Group(kind=fields.get((), {}).get("kind", "all"))
    if top.kind not in ("all", "any"):
        top.kind = "all"
    nodes: dict[tuple[int, ...], Leaf | Group] = {(): top}
    moved: dict[tuple[int, ...], tuple[int, ...]] = {(): ()}
    for path in sorted(fields, key=lambda p: (len(p), p)):
        if not path:
            continue
        parent = nodes.get(path[:-1])
        if not isinstance(parent, Group):
            continue
        moved[path] = (*moved[path[:-1]], len(parent.children))
        values = fields[path]
        node: Leaf | Group
        if "kind" in values:
            node = Group(kind=values["kind"] if values["kind"] in ("all", "any") else "all")
        else:
            node = Leaf(
                attribute=values.get("attribute", ""),
                custom_key=values.get("custom_key", ""),
                operator=values.get("operator", "equal_to"),
                value=values.get("value", ""),
                value_type=values.get("type", "text"),
                changed_from=values.get("from", ""),
            )
        parent.children.append(node)
        nodes[path] = node
    return top, moved


def _typed(raw: str, value_type: str, where: str, errors: FormErrors) -> Any:
    """A value typed in a leaf, as the JSON type its type select says."""
    text = raw.strip()
    if value_type == "number":
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                continue
        errors.add(where, f"{text!r} is not a number")
        return raw
    if value_type == "boolean":
        found = {"true": True, "false": False, "yes": True, "no": False}.get(text.lower())
        if found is None:
            errors.add(where, f"{text!r} is not true or false")
            return raw
        return found
    return raw


def _leaf_json(leaf: Leaf, where: str, errors: FormErrors) -> dict[str, Any]:
    attribute = CUSTOM_PREFIX + leaf.custom_key.strip() if leaf.attribute == "custom" else leaf.attribute
    out: dict[str, Any] = {"attribute": attribute or None, "operator": leaf.operator}
    if leaf.operator in ("is_present", "is_not_present"):
        return out
    if leaf.operator == "attribute_changed":
        change = {}
        if leaf.changed_from.strip():
            change["from"] = _typed(leaf.changed_from, leaf.value_type, f"{where}.value", errors)
        if leaf.value.strip():
            change["to"] = _typed(leaf.value, leaf.value_type, f"{where}.value", errors)
        out["value"] = change
    elif leaf.operator in ("in", "not_in"):
        out["value"] = [
            _typed(item, leaf.value_type, f"{where}.value", errors) for item in comma_list(leaf.value)
        ]
    else:
        out["value"] = _typed(leaf.value, leaf.value_type, f"{where}.value", errors)
    return out


def edit_group(
    root_group: Group,
    posted: dict[tuple[int, ...], tuple[int, ...]],
    verb: str,
    target: str,
    root: str = "conditions",
) -> None:
    """A condition builder's button: ``add_leaf``, ``add_group`` or ``remove`` on the node named ``target``
    as posted (anything else changes nothing)."""
    path = path_of(target, root)
    if path is None or path not in posted:
        return
    path = posted[path]
    if verb == "remove":
        parent = node_at(root_group, path[:-1]) if path else None
        if isinstance(parent, Group) and path[-1] < len(parent.children):
            del parent.children[path[-1]]
        return
    group = node_at(root_group, path)
    if isinstance(group, Group) and verb in ("add_leaf", "add_group"):
        group.children.append(Leaf() if verb == "add_leaf" else Group("any", [Leaf()]))


def group_json(group: Group, where: str, errors: FormErrors) -> dict[str, Any]:
    children = []
    for index, child in enumerate(group.children):
        name = f"{where}.{group.kind}.{index}"
        children.append(
            group_json(child, name, errors) if isinstance(child, Group) else _leaf_json(child, name, errors)
        )
    return {group.kind: children}


def _shown(value: Any) -> tuple[str, str]:
    """A stored value as the form shows it, and its type."""
    if isinstance(value, bool):
        return ("true" if value else "false"), "boolean"
    if isinstance(value, int | float):
        return str(value), "number"
    if isinstance(value, list):
        shown = [_shown(item) for item in value]
        return ", ".join(text for text, _ in shown), (shown[0][1] if shown else "text")
    return ("" if value is None else str(value)), "text"


def group_of(raw: dict[str, Any]) -> Group:
    kind = "any" if "any" in raw else "all"
    children: list[Leaf | Group] = []
    for child in raw.get(kind, []):
        if "all" in child or "any" in child:
            children.append(group_of(child))
            continue
        attribute = str(child.get("attribute", ""))
        custom = attribute.startswith(CUSTOM_PREFIX)
        value = child.get("value")
        leaf = Leaf(
            attribute="custom" if custom else attribute,
            custom_key=attribute.removeprefix(CUSTOM_PREFIX) if custom else "",
            operator=str(child.get("operator", "")),
        )
        if isinstance(value, dict):
            leaf.value, leaf.value_type = _shown(value.get("to"))
            leaf.changed_from, from_type = _shown(value.get("from"))
            if "to" not in value:
                leaf.value_type = from_type
        else:
            leaf.value, leaf.value_type = _shown(value)
        children.append(leaf)
    return Group(kind, children)


def summary(raw: dict[str, Any] | None) -> str:
    """Conditions in one line, attributes by their labels: ``Message direction equal to "incoming" and (… or
    …)`` (``always`` for none)."""
    if not raw or not (raw.get("all") or raw.get("any")):
        return "always"
    return _summary(raw, top=True)


def _summary(raw: dict[str, Any], top: bool = False) -> str:
    if "all" in raw or "any" in raw:
        kind = "all" if "all" in raw else "any"
        parts = [_summary(child) for child in raw[kind]]
        text = f" {'and' if kind == 'all' else 'or'} ".join(parts) or "always"
        return text if top or len(parts) < 2 else f"({text})"
    operator = str(raw.get("operator", "")).replace("_", " ")
    attribute = label(str(raw.get("attribute", "")), "attribute")
    if "value" not in raw:
        return f"{attribute} {operator}"
    return f"{attribute} {operator} {json.dumps(raw['value'], ensure_ascii=False)}"


def leaf_name(parent: str, kind: str, index: int) -> str:
    return f"{parent}.{kind}.{index}"
