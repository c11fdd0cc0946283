"""A rule's actions: a tagged union on ``type``, validated when the rule is saved, and run by the triggers
service for a matching trigger (in a savepoint of the rule's own).

An action is one class (:class:`~.base.BaseAction`): its fields (with the dashboard's label of each, in
the field's metadata: :func:`~.base.form`), its ``validate`` and its ``run``. A new kind of action is a
struct in the module of what it acts on (:mod:`.conversation`, :mod:`.contact`, :mod:`.enroll`,
:mod:`.message`, :mod:`.webhook`) and a member of :data:`Action`; the rule form of the dashboard derives its
inputs from it.

Every change an action makes carries who made it (``executed_by``: ``rule:<id>``) and records no trigger:
rules never fire rules (the loop guard). A business refusal (an opted-out contact, an enrollment the
sequence refuses, no conversation to act on, a message too long once filled in) raises
:class:`ActionRejected` and is an outcome, not an error.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, get_args

from psycopg import Connection

from libs.common.contracts.limits import MAX_RULE_ACTIONS
from libs.common.core.db import buffered_pipeline
from libs.common.core.errors import InvalidInput
from libs.common.rules.actions.base import (
    BUSINESS_ERRORS,
    MAX_ITEMS,
    ActionRefusal,
    ActionRejected,
    BaseAction,
    Check,
    Done,
    RuleRefusal,
    Subject,
    form,
    refusal_of,
)
from libs.common.rules.actions.contact import AddContactTag, RemoveContactTag
from libs.common.rules.actions.conversation import (
    MAX_SNOOZE_MINUTES,
    AddLabel,
    AddPrivateNote,
    AssignAgent,
    AssignTeam,
    ChangePriority,
    ChangeStatus,
    RemoveLabel,
    SnoozeUntil,
)
from libs.common.rules.actions.enroll import EnrollInSequence
from libs.common.rules.actions.message import SendMessage
from libs.common.rules.actions.webhook import SendWebhook

__all__ = [
    "ACTION_KINDS",
    "BUSINESS_ERRORS",
    "MAX_ACTIONS",
    "MAX_ITEMS",
    "MAX_SNOOZE_MINUTES",
    "Action",
    "ActionRefusal",
    "ActionRejected",
    "AddContactTag",
    "AddLabel",
    "AddPrivateNote",
    "AssignAgent",
    "AssignTeam",
    "BaseAction",
    "ChangePriority",
    "ChangeStatus",
    "Check",
    "Done",
    "EnrollInSequence",
    "RemoveContactTag",
    "RemoveLabel",
    "RuleRefusal",
    "SendMessage",
    "SendWebhook",
    "Sent",
    "SnoozeUntil",
    "Subject",
    "action_type",
    "check_action_count",
    "form",
    "refusal_of",
    "run_actions",
    "send_actions",
    "validate_actions",
]

#: Every kind of action, tagged on ``type`` (the order the dashboard lists them in).
Action = (
    EnrollInSequence
    | SendMessage
    | AddLabel
    | RemoveLabel
    | AddContactTag
    | RemoveContactTag
    | AssignAgent
    | AssignTeam
    | ChangeStatus
    | ChangePriority
    | SnoozeUntil
    | AddPrivateNote
    | SendWebhook
)

#: The struct of each kind of action, in the order of :data:`Action`.
ACTION_KINDS: tuple[type[BaseAction], ...] = get_args(Action)

#: Most actions one rule may have.
MAX_ACTIONS = MAX_RULE_ACTIONS


def action_type(action: BaseAction) -> str:
    """An action's kind: its ``type`` tag (``add_label``)."""
    kind = type(action).__struct_config__.tag
    assert isinstance(kind, str)
    return kind


def check_action_count(actions: list[Action]) -> None:
    """A rule has 1 to :data:`MAX_ACTIONS` actions."""
    if not actions:
        raise InvalidInput("a rule needs at least one action", field="actions")
    if len(actions) > MAX_ACTIONS:
        raise InvalidInput(f"a rule has at most {MAX_ACTIONS} actions", field="actions")


def validate_actions(conn: Connection[Any], project_id: uuid.UUID, actions: list[Action]) -> list[Action]:
    """Check every action against the project (its sequences) and its own rules; errors name
    ``actions.<i>.<field>``."""
    check_action_count(actions)
    for index, action in enumerate(actions):
        action.validate(conn, project_id, f"actions.{index}")
    return actions


@dataclass(frozen=True)
class Sent:
    """A rule's actions run with their writes sent, not yet read: what they did, and what is left to check."""

    done: Done
    checks: list[Check]

    def checked(self) -> Done:
        """Read what the actions left to check (raising what they would have raised); what they did."""
        for check in self.checks:
            check()
        return self.done


def send_actions(
    conn: Connection[Any], rule_id: uuid.UUID, actions: list[Action], subject: Subject, *, now: datetime
) -> Sent:
    """Run a rule's actions in order, in the caller's transaction, leaving what they only check of their
    writes to :meth:`Sent.checked`: in the caller's pipeline those writes go out with the statements after
    them (a trigger's actions go with its first round trip). An action that reads before it writes (a
    conversation's lock) still reads at once."""
    done = Done()
    checks: list[Check] = []
    for action in actions:
        check = action.run(conn, rule_id, subject, now, done)
        if check is not None:
            checks.append(check)
    return Sent(done, checks)


def run_actions(
    conn: Connection[Any], rule_id: uuid.UUID, actions: list[Action], subject: Subject, *, now: datetime
) -> Done:
    """Run a rule's actions in order, in the caller's transaction (the caller holds a savepoint): their
    writes go out together, then each is checked."""
    with buffered_pipeline(conn):
        sent = send_actions(conn, rule_id, actions, subject, now=now)
    return sent.checked()
