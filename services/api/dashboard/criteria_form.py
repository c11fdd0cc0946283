"""The sequence page's goals and exits form: each goal (a name, a rule event, conditions in the rules'
syntax) and each exit (the same, and whether it blocks entry while its conditions hold), and the conversion
window; read from a posted form into the definition's JSON and back.

Inputs carry the definition's field names (``definition.goals.0.name``, ``definition.exits.1.conditions...``,
``definition.conversion_window_seconds``), so ``validate_definition``'s errors are shown next to them. Each
criterion's conditions are the rule form's condition builder (:mod:`.condition_form`) rooted at its
``conditions`` field. "Add goal", "Add exit", the condition buttons and "Remove" post the form (``_op``),
which comes back with the change and nothing saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

from libs.common.followups.definition import Definition
from libs.common.platform.conditions import Event
from services.api.dashboard.condition_form import Group, edit_group, group_from_form, group_json, group_of
from services.api.dashboard.forms import SECOND_UNITS, Form, FormErrors, join_delay, split_delay

#: The events a goal or an exit is met on.
EVENTS: list[str] = list(get_args(Event))
#: The two lists the form edits.
KINDS = ("goals", "exits")
WINDOW = "definition.conversion_window_seconds"


@dataclass
class Criterion:
    name: str = ""
    event: str = "lead.status_changed"
    conditions: Group = field(default_factory=Group)
    #: Each posted condition's path (the positions its name held) -> its path in ``conditions``.
    posted: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    #: An exit's: refuse to enroll a contact for whom its conditions hold.
    blocks_entry: bool = False


@dataclass
class CriteriaForm:
    goals: list[Criterion] = field(default_factory=list)
    exits: list[Criterion] = field(default_factory=list)
    window_value: str = "7"
    window_unit: str = "days"

    @classmethod
    def of_definition(cls, definition: Definition) -> CriteriaForm:
        value, unit = split_delay(definition.conversion_window_seconds, SECOND_UNITS)
        return cls(
            goals=[Criterion(g.name, g.event, group_of(g.conditions or {})) for g in definition.goals],
            exits=[
                Criterion(e.name, e.event, group_of(e.conditions or {}), blocks_entry=e.blocks_entry)
                for e in definition.exits
            ],
            window_value=value or "0",
            window_unit=unit,
        )

    @classmethod
    def of_form(cls, form: Form) -> CriteriaForm:
        out = cls(window_value=form.get("window_value"), window_unit=form.get("window_unit") or "days")
        for kind in KINDS:
            prefix = f"definition.{kind}"
            indexes = {name.split(".")[2] for name in form.items(prefix + ".")}
            for i in sorted(int(index) for index in indexes if index.isdigit()):
                where = f"{prefix}.{i}"
                conditions, posted = group_from_form(form, f"{where}.conditions")
                criterion = Criterion(
                    name=form.get(f"{where}.name"),
                    event=form.get(f"{where}.event"),
                    conditions=conditions,
                    posted=posted,
                    blocks_entry=form.checked(f"{where}.blocks_entry"),
                )
                getattr(out, kind).append(criterion)
        return out

    def apply(self, op: str) -> None:
        """A form button: ``add_goal``, ``add_exit``, ``remove:definition.goals.<i>``, or a criterion's
        condition button (``add_leaf:definition.exits.0.conditions``; see :func:`edit_group`)."""
        verb, _, target = op.partition(":")
        if verb in ("add_goal", "add_exit"):
            getattr(self, f"{verb[4:]}s").append(Criterion())
            return
        parts = target.split(".")
        if len(parts) < 3 or parts[1] not in KINDS or not parts[2].isdigit():
            return
        rows: list[Criterion] = getattr(self, parts[1])
        index = int(parts[2])
        if index >= len(rows):
            return
        if verb == "remove" and len(parts) == 3:
            del rows[index]
        elif len(parts) > 3:
            row = rows[index]
            edit_group(row.conditions, row.posted, verb, target, f"definition.{parts[1]}.{index}.conditions")

    def payload(self, errors: FormErrors) -> dict[str, Any]:
        """The definition's ``goals``, ``exits`` and ``conversion_window_seconds``."""
        out: dict[str, Any] = {}
        for kind in KINDS:
            out[kind] = []
            for i, row in enumerate(getattr(self, kind)):
                where = f"definition.{kind}.{i}.conditions"
                item: dict[str, Any] = {
                    "name": row.name.strip(),
                    "event": row.event,
                    "conditions": group_json(row.conditions, where, errors)
                    if row.conditions.children
                    else None,
                }
                if kind == "exits":
                    item["blocks_entry"] = row.blocks_entry
                out[kind].append(item)
        window = join_delay(self.window_value, self.window_unit, SECOND_UNITS, WINDOW, errors, required=True)
        out["conversion_window_seconds"] = 0 if window is None else window
        return out
