"""The action list of the rule form: each kind's inputs, derived from its struct in
:mod:`libs.common.rules.actions` (the field's name, its type, its label from the field's ``form`` metadata),
a posted row read into the API's JSON and a stored action drawn back as a row.

An input is named with the API's path (``actions.<i>.<field>``; a nested struct's fields
``actions.<i>.whatsapp_template.name``). The widget follows the type unless the field names one: a list of
strings is a comma-separated ``list``, an object a ``textarea`` of ``key=value`` lines, a ``Literal`` a
select of its values (``none`` first when it may be null), anything else a ``text``; a list shown in a
``textarea`` is one item a line.
"""

from __future__ import annotations

import json
import types
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import msgspec

from libs.common.rules.actions import ACTION_KINDS, Action, BaseAction
from services.api.dashboard.forms import FormErrors, comma_list, key_value_text, key_values, lines

#: How a posted input becomes its JSON value.
Reading = Literal["raw", "stripped", "or_default", "or_none", "number", "object", "list", "lines"]


@dataclass(frozen=True)
class ActionInput:
    """One input of an action on the rule form."""

    #: The field's path in the action (``text``, ``whatsapp_template.name``).
    name: str
    label: str
    #: ``text``, ``textarea``, ``list`` or ``select:<choices>``.
    widget: str
    reading: Reading
    #: The field's default, for an empty ``or_default`` input.
    default: Any = None
    #: A select's choices, (value, shown).
    choices: tuple[tuple[str, str], ...] = ()


@dataclass
class ActionRow:
    """An action as the form shows and posts it: its type and each input's text."""

    type: str
    fields: dict[str, str] = field(default_factory=dict)


def _unwrapped(hint: Any) -> tuple[Any, bool, dict[str, Any]]:
    """A field's type without ``Annotated`` and ``None``: (the type, whether it may be null, its form
    metadata)."""
    meta: dict[str, Any] = {}
    if get_origin(hint) is Annotated:
        for item in hint.__metadata__:
            if isinstance(item, msgspec.Meta) and item.extra and "form" in item.extra:
                meta = item.extra["form"]
        hint = get_args(hint)[0]
    optional = False
    if get_origin(hint) in (Union, types.UnionType):
        members = [arg for arg in get_args(hint) if arg is not type(None)]
        optional = len(members) < len(get_args(hint))
        hint = members[0] if len(members) == 1 else hint
    return hint, optional, meta


def _input(
    name: str, hint: Any, optional: bool, default: Any, label: str, widget: str | None, select: str
) -> ActionInput:
    if get_origin(hint) is Literal:
        values = tuple((str(v), str(v)) for v in get_args(hint))
        choices = ((("", "none"),) if optional else ()) + values
        if not optional and isinstance(default, str):  # left empty: the field's default
            return ActionInput(name, label, widget or f"select:{select}", "or_default", default, choices)
        return ActionInput(
            name, label, widget or f"select:{select}", "or_none" if optional else "raw", None, choices
        )
    if get_origin(hint) is dict:
        return ActionInput(name, label, widget or "textarea", "object")
    if get_origin(hint) is list:
        widget = widget or "list"
        return ActionInput(name, label, widget, "list" if widget == "list" else "lines")
    if hint is int:
        return ActionInput(name, label, widget or "text", "number")
    if optional:
        return ActionInput(name, label, widget or "text", "or_none")
    if hint is str and isinstance(default, str):
        return ActionInput(name, label, widget or "text", "or_default", default)
    return ActionInput(name, label, widget or "text", "raw")


def _label(name: str) -> str:
    return name.replace("_", " ").capitalize()


def inputs_of(kind: type[BaseAction]) -> list[ActionInput]:
    """The inputs of one kind of action, in the order of its fields (a nested struct's flattened)."""
    hints = get_type_hints(kind, include_extras=True)
    tag = str(kind.__struct_config__.tag)
    out: list[ActionInput] = []
    for info in msgspec.structs.fields(kind):
        hint, optional, meta = _unwrapped(hints[info.name])
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
            parts: dict[str, Any] = meta.get("parts", {})
            nested = get_type_hints(hint, include_extras=True)
            for sub in msgspec.structs.fields(hint):
                part = parts.get(sub.name, _label(sub.name))
                label, widget = (part, None) if isinstance(part, str) else part
                sub_hint, sub_optional, _ = _unwrapped(nested[sub.name])
                name = f"{info.name}.{sub.name}"
                # a nested struct's text is read stripped, and left out when empty
                found = _input(name, sub_hint, sub_optional, None, label, widget, f"{tag}.{name}")
                out.append(found if found.reading not in ("raw", "or_default") else _stripped(found))
            continue
        label = meta.get("label", _label(info.name))
        out.append(
            _input(info.name, hint, optional, info.default, label, meta.get("widget"), f"{tag}.{info.name}")
        )
    return out


def _stripped(found: ActionInput) -> ActionInput:
    return replace(found, reading="stripped", default=None)


def _nested_required(kind: type[BaseAction]) -> dict[str, list[str]]:
    """Each nested struct's field of ``kind`` -> its required fields (a form without them leaves it out)."""
    hints = get_type_hints(kind, include_extras=True)
    out: dict[str, list[str]] = {}
    for info in msgspec.structs.fields(kind):
        hint, _, _ = _unwrapped(hints[info.name])
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
            out[info.name] = [sub.name for sub in msgspec.structs.fields(hint) if sub.required]
    return out


#: Each kind of action (by its ``type``) -> its inputs, derived from the structs.
ACTION_FIELDS: dict[str, list[ActionInput]] = {
    str(k.__struct_config__.tag): inputs_of(k) for k in ACTION_KINDS
}
#: Each kind of action -> its nested structs' fields -> their required fields.
_NESTED: dict[str, dict[str, list[str]]] = {
    str(k.__struct_config__.tag): _nested_required(k) for k in ACTION_KINDS
}
#: The kinds of action, in the order of the union.
ACTION_TYPES: list[str] = list(ACTION_FIELDS)
#: The choices of every select an action's type gives (a ``Literal``), by the select's name.
ACTION_CHOICES: dict[str, list[tuple[str, str]]] = {
    item.widget.removeprefix("select:"): list(item.choices)
    for fields in ACTION_FIELDS.values()
    for item in fields
    if item.choices
}


def builtins(actions: list[Action]) -> list[dict[str, Any]]:
    """Stored actions as the API's JSON."""
    return list(msgspec.to_builtins(actions))


def action_row(raw: dict[str, Any]) -> ActionRow:
    """A stored action (its JSON) as the form shows it."""
    kind = str(raw.get("type", ""))
    row = ActionRow(kind)
    for item in ACTION_FIELDS.get(kind, []):
        head, _, sub = item.name.partition(".")
        value = (raw.get(head) or {}).get(sub) if sub else raw.get(head)
        if value is None:
            row.fields[item.name] = ""
        elif isinstance(value, list):
            row.fields[item.name] = (
                ", ".join(map(str, value)) if item.widget == "list" else "\n".join(map(str, value))
            )
        elif isinstance(value, dict):
            row.fields[item.name] = key_value_text(value)
        else:
            row.fields[item.name] = str(value)
    return row


def action_json(row: ActionRow, where: str, errors: FormErrors) -> dict[str, Any]:
    """A posted action as the API's JSON; what cannot be read is added to ``errors``."""
    out: dict[str, Any] = {"type": row.type}
    nested: dict[str, dict[str, Any]] = {}
    for item in ACTION_FIELDS.get(row.type, []):
        raw = row.fields.get(item.name, "")
        head, _, sub = item.name.partition(".")
        if sub:
            if item.reading == "stripped":
                if raw.strip():
                    nested.setdefault(head, {})[sub] = raw.strip()
            else:
                nested.setdefault(head, {})[sub] = _read(item, raw, f"{where}.{item.name}", errors)
            continue
        out[item.name] = _read(item, raw, f"{where}.{item.name}", errors)
    for head, value in nested.items():
        if all(value.get(name) for name in _NESTED[row.type][head]):
            out[head] = value
    return out


def _read(item: ActionInput, raw: str, where: str, errors: FormErrors) -> Any:
    match item.reading:
        case "list":
            return comma_list(raw)
        case "lines":
            return lines(raw)
        case "object":
            return key_values(raw, where, errors)
        case "or_none":
            return raw.strip() or None
        case "or_default":
            return raw.strip() or item.default
        case "number":
            return int(raw) if raw.strip().isdigit() else raw
        case "stripped":
            return raw.strip()
        case _:
            return raw


def action_sequence_ids(actions: list[Action]) -> list[uuid.UUID]:
    """The sequences the actions name (an ``enroll_in_sequence``'s), to show them by name."""
    return [uuid.UUID(str(raw["sequence_id"])) for raw in builtins(actions) if raw.get("sequence_id")]


def actions_summary(
    actions: list[Action], sequence_names: Mapping[uuid.UUID, str] | None = None
) -> list[str]:
    """Each action in a few words (``add label: vip``, ``send message: "Just checking in"``, ``enroll in
    sequence: Welcome``: a sequence by its name, "deleted sequence" when it is gone)."""
    names = sequence_names or {}
    out = []
    for raw in builtins(actions):
        kind = str(raw.pop("type")).replace("_", " ")
        details = []
        for key, value in raw.items():
            if value in (None, [], {}, "none"):
                continue
            if key == "sequence_id":
                details.append(names.get(uuid.UUID(str(value)), "deleted sequence"))
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
