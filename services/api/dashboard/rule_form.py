"""The rule form (seed 002 section 5.6): its fields, the condition builder (groups ``all`` / ``any`` nested
to any depth) and the action list, read from a posted form and turned into the API's JSON, and back.

Inputs are named with the API's paths, so the domain's errors land next to them: a group's children are
``<group>.<kind>.<i>`` (the root group is ``conditions``), a leaf's inputs ``<leaf>.attribute``,
``<leaf>.operator`` and ``<leaf>.value``; actions are ``actions.<i>.<field>``. A group's kind is an input of
its own (``<group>.kind``): the names a form was drawn with may hold an old kind, so a posted form is read
by the positions in the names, and drawn again with the kinds chosen.

The builder needs no script: "Add condition", "Add group", "Remove" and "Add action" are submit buttons
(``_op``) that post the form, which comes back with the change and nothing saved; "Save" validates and
saves it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, get_args

from libs.common.rules.actions import Action
from libs.common.rules.conditions import ATTRIBUTES, CUSTOM_PREFIX
from libs.common.rules.rules import Event, Rule
from services.api.dashboard.forms import (
    MINUTE_UNITS,
    Form,
    FormErrors,
    comma_list,
    join_delay,
    key_value_text,
    key_values,
    lines,
    split_delay,
)

EVENTS: list[str] = list(get_args(Event))
ACTION_TYPES: list[str] = [str(kind.__struct_config__.tag) for kind in get_args(Action)]
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
VALUE_TYPES = [("text", "text"), ("number", "number"), ("boolean", "true / false")]
#: Each action type's inputs: (field, label, widget) with widget text, textarea, lines, list, select:<name>.
ACTION_FIELDS: dict[str, list[tuple[str, str, str]]] = {
    "enroll_in_sequence": [
        ("sequence_id", "Sequence", "select:sequences"),
        ("anchor", "Anchor (none, event_time or contact.attributes.<key>)", "text"),
        ("variables", "Variables (key=value, one a line)", "textarea"),
    ],
    "send_message": [
        ("text", "Message", "textarea"),
        ("whatsapp_template.name", "WhatsApp template name (optional)", "text"),
        ("whatsapp_template.language", "Template language", "text"),
        ("whatsapp_template.parameters", "Template parameters (one a line)", "textarea"),
    ],
    "add_label": [("labels", "Labels (comma separated)", "list")],
    "remove_label": [("labels", "Labels (comma separated)", "list")],
    "add_contact_tag": [("tags", "Tags (comma separated)", "list")],
    "remove_contact_tag": [("tags", "Tags (comma separated)", "list")],
    "assign_agent": [("assignee", "Agent (empty: unassign)", "text")],
    "assign_team": [("team", "Team (empty: none)", "text")],
    "change_status": [("status", "Status", "select:statuses")],
    "change_priority": [("priority", "Priority", "select:priorities")],
    "snooze_until": [("minutes", "Minutes", "text")],
    "add_private_note": [("text", "Note", "textarea")],
    "send_webhook": [("url", "URL (http or https)", "text")],
}
STATUSES = [(s, s) for s in ("open", "pending", "snoozed", "resolved")]
PRIORITIES = [("", "none"), *[(p, p) for p in ("low", "medium", "high", "urgent")]]


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


@dataclass
class ActionRow:
    type: str
    fields: dict[str, str] = field(default_factory=dict)


@dataclass
class RuleForm:
    """What the rule form shows and posts."""

    name: str = ""
    event: str = "message.created"
    delayed: bool = False
    delay_value: str = "4"
    delay_unit: str = "hours"
    business_hours: bool = False
    active: bool = True
    conditions: Group = field(default_factory=Group)
    #: Each posted node's path (the positions its name held) -> its path in ``conditions``.
    posted: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    actions: list[ActionRow] = field(default_factory=lambda: [ActionRow("add_label")])
    new_action_type: str = "add_label"

    # --- to and from a stored rule --------------------------------------------------------------------

    @classmethod
    def of_rule(cls, rule: Rule) -> RuleForm:
        value, unit = split_delay(rule.execution_delay_minutes, MINUTE_UNITS)
        return cls(
            name=rule.name,
            event=rule.event,
            delayed=rule.execution_delay_minutes is not None,
            delay_value=value or "4",
            delay_unit=unit if rule.execution_delay_minutes is not None else "hours",
            business_hours=rule.delay_in_business_hours,
            active=rule.active,
            conditions=_group_of(rule.conditions),
            actions=[_action_row(action) for action in _builtins(rule.actions)],
        )

    # --- from a posted form ---------------------------------------------------------------------------

    @classmethod
    def of_form(cls, form: Form) -> RuleForm:
        actions: dict[int, ActionRow] = {}
        for name, value in form.items("actions.").items():
            _, index, rest = name.split(".", 2) if name.count(".") >= 2 else ("", "", "")
            if not index.isdigit():
                continue
            row = actions.setdefault(int(index), ActionRow(""))
            if rest == "type":
                row.type = value
            else:
                row.fields[rest] = value
        conditions, posted = _group_from_form(form)
        return cls(
            name=form.get("name"),
            event=form.get("event"),
            delayed=form.get("execute") == "delayed",
            delay_value=form.get("delay_value"),
            delay_unit=form.get("delay_unit") or "hours",
            business_hours=form.checked("delay_in_business_hours"),
            active=form.checked("active"),
            conditions=conditions,
            posted=posted,
            actions=[actions[i] for i in sorted(actions) if actions[i].type in ACTION_TYPES],
            new_action_type=form.get("new_action_type") or "add_label",
        )

    def apply(self, op: str) -> None:
        """A builder button: ``add_leaf:<group>``, ``add_group:<group>``, ``remove:<node>``, ``add_action``,
        ``remove_action:<i>`` (anything else changes nothing: the form is drawn again as posted)."""
        verb, _, target = op.partition(":")
        if verb == "add_action" and self.new_action_type in ACTION_TYPES:
            self.actions.append(ActionRow(self.new_action_type))
        elif verb == "remove_action" and target.isdigit() and int(target) < len(self.actions):
            del self.actions[int(target)]
        elif verb in ("add_leaf", "add_group", "remove"):
            path = _path_of(target)
            if path is None or path not in self.posted:
                return
            path = self.posted[path]
            if verb == "remove":
                parent = _node_at(self.conditions, path[:-1]) if path else None
                if isinstance(parent, Group) and path[-1] < len(parent.children):
                    del parent.children[path[-1]]
                return
            group = _node_at(self.conditions, path)
            if isinstance(group, Group):
                group.children.append(Leaf() if verb == "add_leaf" else Group("any", [Leaf()]))

    def payload(self, errors: FormErrors) -> dict[str, Any]:
        """The rule as the API's JSON body (``RuleCreate``); what cannot be read is added to ``errors``."""
        delay = (
            join_delay(
                self.delay_value,
                self.delay_unit,
                MINUTE_UNITS,
                "execution_delay_minutes",
                errors,
                required=True,
            )
            if self.delayed
            else None
        )
        return {
            "name": self.name,
            "event": self.event,
            "conditions": _group_json(self.conditions, "conditions", errors)
            if self.conditions.children
            else None,
            "actions": [_action_json(row, f"actions.{i}", errors) for i, row in enumerate(self.actions)],
            "execution_delay_minutes": delay,
            "delay_in_business_hours": self.business_hours,
            "active": self.active,
        }


# --- conditions ---------------------------------------------------------------------------------------------


def _path_of(name: str) -> tuple[int, ...] | None:
    """The child indexes a node's name walks (``conditions.all.1.any.0`` -> ``(1, 0)``)."""
    parts = name.split(".")
    if not parts or parts[0] != "conditions":
        return None
    path: list[int] = []
    rest = parts[1:]
    while len(rest) >= 2 and rest[0] in ("all", "any") and rest[1].isdigit():
        path.append(int(rest[1]))
        rest = rest[2:]
    return tuple(path) if not rest else None


def _node_at(root: Group, path: tuple[int, ...]) -> Leaf | Group | None:
    node: Leaf | Group = root
    for index in path:
        if not isinstance(node, Group) or index >= len(node.children):
            return None
        node = node.children[index]
    return node


def _group_from_form(form: Form) -> tuple[Group, dict[tuple[int, ...], tuple[int, ...]]]:
    """The tree a posted form describes (by the positions in the names; see the module), and where each
    posted node went in it (a gap in the posted positions closes up)."""
    fields: dict[tuple[int, ...], dict[str, str]] = {}
    for name, value in form.items("conditions").items():
        head, _, last = name.rpartition(".")
        path = _path_of(head)
        if path is not None:
            fields.setdefault(path, {})[last] = value
    root = Group(kind=fields.get((), {}).get("kind", "all"))
    if root.kind not in ("all", "any"):
        root.kind = "all"
    nodes: dict[tuple[int, ...], Leaf | Group] = {(): root}
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
    return root, moved


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


def _group_json(group: Group, where: str, errors: FormErrors) -> dict[str, Any]:
    children = []
    for index, child in enumerate(group.children):
        name = f"{where}.{group.kind}.{index}"
        children.append(
            _group_json(child, name, errors) if isinstance(child, Group) else _leaf_json(child, name, errors)
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


def _group_of(raw: dict[str, Any]) -> Group:
    kind = "any" if "any" in raw else "all"
    children: list[Leaf | Group] = []
    for child in raw.get(kind, []):
        if "all" in child or "any" in child:
            children.append(_group_of(child))
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
    """Conditions in one line: ``message.type equal to "incoming" and (… or …)`` (``always`` for none)."""
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
    if "value" not in raw:
        return f"{raw.get('attribute')} {operator}"
    return f"{raw.get('attribute')} {operator} {json.dumps(raw['value'], ensure_ascii=False)}"


# --- actions ------------------------------------------------------------------------------------------------


def _builtins(actions: list[Action]) -> list[dict[str, Any]]:
    import msgspec

    return list(msgspec.to_builtins(actions))


def _action_row(raw: dict[str, Any]) -> ActionRow:
    kind = str(raw.get("type", ""))
    row = ActionRow(kind)
    for name, _, widget in ACTION_FIELDS.get(kind, []):
        if name.startswith("whatsapp_template."):
            template = raw.get("whatsapp_template") or {}
            item = template.get(name.split(".", 1)[1])
        else:
            item = raw.get(name)
        if item is None:
            row.fields[name] = ""
        elif isinstance(item, list):
            row.fields[name] = ", ".join(map(str, item)) if widget == "list" else "\n".join(map(str, item))
        elif isinstance(item, dict):
            row.fields[name] = key_value_text(item)
        else:
            row.fields[name] = str(item)
    return row


def _action_json(row: ActionRow, where: str, errors: FormErrors) -> dict[str, Any]:
    out: dict[str, Any] = {"type": row.type}
    template: dict[str, Any] = {}
    for name, _, widget in ACTION_FIELDS.get(row.type, []):
        raw = row.fields.get(name, "")
        if name.startswith("whatsapp_template."):
            key = name.split(".", 1)[1]
            if key == "parameters":
                template[key] = lines(raw)
            elif raw.strip():
                template[key] = raw.strip()
            continue
        if widget == "list":
            out[name] = comma_list(raw)
        elif name == "variables":
            out[name] = key_values(raw, f"{where}.variables", errors)
        elif name in ("assignee", "team", "priority"):
            out[name] = raw.strip() or None
        elif name == "minutes":
            out[name] = int(raw) if raw.strip().isdigit() else raw
        elif name == "anchor":
            out[name] = raw.strip() or "none"
        else:
            out[name] = raw
    if template.get("name"):
        out["whatsapp_template"] = template
    return out


def actions_summary(actions: list[Action]) -> list[str]:
    """Each action in a few words (``add label: vip``, ``send message: "Just checking in"``)."""
    out = []
    for raw in _builtins(actions):
        kind = str(raw.pop("type")).replace("_", " ")
        details = []
        for value in raw.values():
            if value in (None, [], {}, "none"):
                continue
            if isinstance(value, list):
                details.append(", ".join(map(str, value)))
            elif isinstance(value, str) and len(value) > 60:
                details.append(value[:57] + "…")
            elif isinstance(value, dict):
                details.append(json.dumps(value, ensure_ascii=False)[:60])
            else:
                details.append(str(value))
        out.append(f"{kind}: {'; '.join(details)}" if details else kind)
    return out


def leaf_name(parent: str, kind: str, index: int) -> str:
    return f"{parent}.{kind}.{index}"
