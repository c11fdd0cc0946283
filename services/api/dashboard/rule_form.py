"""The rule form (seed 002 section 5.6): its fields, the condition builder (:mod:`.condition_form`: groups
``all`` / ``any`` nested to any depth) and the action list (:mod:`.action_form`: each kind's inputs derived
from its struct), read from a posted form and turned into the API's JSON, and back.

Inputs are named with the API's paths, so the domain's errors land next to them: conditions are
``conditions.<kind>.<i>...``, actions ``actions.<i>.<field>``.

The builder needs no script: "Add condition", "Add group", "Remove" and "Add action" are submit buttons
(``_op``) that post the form, which comes back with the change and nothing saved; "Save" validates and
saves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

from libs.common.platform.conditions import Event
from libs.common.rules.rules import Rule
from services.api.dashboard.action_form import ACTION_TYPES, ActionRow, action_json, action_row, builtins
from services.api.dashboard.condition_form import Group, edit_group, group_from_form, group_json, group_of
from services.api.dashboard.forms import MINUTE_UNITS, Form, FormErrors, join_delay, split_delay

#: The events a rule can be triggered by.
EVENTS: list[str] = list(get_args(Event))


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
            conditions=group_of(rule.conditions),
            actions=[action_row(action) for action in builtins(rule.actions)],
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
        conditions, posted = group_from_form(form)
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
        else:
            edit_group(self.conditions, self.posted, verb, target)

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
            "conditions": group_json(self.conditions, "conditions", errors)
            if self.conditions.children
            else None,
            "actions": [action_json(row, f"actions.{i}", errors) for i, row in enumerate(self.actions)],
            "execution_delay_minutes": delay,
            "delay_in_business_hours": self.business_hours,
            "active": self.active,
        }
