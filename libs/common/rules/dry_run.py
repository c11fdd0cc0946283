"""A rule's dry run: the rule evaluated now for a contact (and a conversation, and the event's own data),
without acting.

It records, in a savepoint it always rolls back (:func:`~libs.common.core.effects.rolled_back`), the
trigger an event of the rule's type would record (the same insert,
:func:`~libs.common.rules.triggers.insert_trigger`, with the conversation's anchors of this moment and the
event data the request gives), and reads the rule's trace over it (:func:`~libs.common.rules.trace.trace`:
each node's result and each condition's value, in ONE statement, by the same compiled predicates the
triggers service matches with; what a rule run keeps too).

A delayed rule that matches also gets the episode and the due time :func:`~.executions.schedule` would
record (:func:`~.executions.rule_episode`, :func:`~.executions.due_time`). Nothing runs: no action, no
webhook, no message; the trigger row goes with the savepoint.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Annotated, Any, Final, Literal, get_args

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import MAX_LABEL_LENGTH, MAX_LABELS, Text
from libs.common.core import validation
from libs.common.core.effects import rolled_back
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.platform import contacts, conversations
from libs.common.platform.conditions import Event
from libs.common.rules.actions import Action
from libs.common.rules.executions import due_time, rule_episode
from libs.common.rules.rules import compile_rule, get_rule
from libs.common.rules.trace import ConditionResult, DelayedRun, trace
from libs.common.rules.triggers import insert_trigger

log = logging.getLogger(__name__)

#: The events that happen in a conversation: their trigger names one (the others never do).
IN_A_CONVERSATION: Final = frozenset(
    event for event in get_args(Event) if event.startswith(("conversation.", "message."))
)
#: Most attributes one event's ``changed`` names.
MAX_CHANGED = 100

#: A tag or label of the event's lists.
EventLabel = Annotated[str, msgspec.Meta(max_length=MAX_LABEL_LENGTH)]
#: The tags or labels one change added or removed.
EventLabels = Annotated[list[EventLabel], msgspec.Meta(max_length=MAX_LABELS)]
#: An attribute a change names (``conversation.status``, ``contact.attributes.plan``).
ChangedName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class EventMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The event's message (``message.created``): ``message.type`` and ``message.content``."""

    type: Literal["incoming", "outgoing"]
    content: Text = ""


class Change(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """What a change did to one attribute: the JSON value it had and the one it has (``attribute_changed``
    compares them)."""

    from_: Any = msgspec.field(name="from", default=msgspec.UNSET)
    to: Any = msgspec.UNSET


#: The attributes one event changed.
Changes = Annotated[dict[ChangedName, Change], msgspec.Meta(max_length=MAX_CHANGED)]


class EventData(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The event's own data, as its trigger records it (each field absent: the event carries none). At most
    16 KB as JSON, no NUL character."""

    message: EventMessage | msgspec.UnsetType = msgspec.UNSET
    #: The attributes the event changed (``changed``), each with its ``from`` and ``to``.
    changed: Changes | msgspec.UnsetType = msgspec.UNSET
    tags_added: EventLabels | msgspec.UnsetType = msgspec.UNSET
    tags_removed: EventLabels | msgspec.UnsetType = msgspec.UNSET
    labels_added: EventLabels | msgspec.UnsetType = msgspec.UNSET
    labels_removed: EventLabels | msgspec.UnsetType = msgspec.UNSET
    #: The event's lead (``lead.status`` reads it when it is the contact's; else the contact's newest).
    lead_id: uuid.UUID | msgspec.UnsetType = msgspec.UNSET
    #: The event's deal (``deal.stage``, as ``lead_id``).
    deal_id: uuid.UUID | msgspec.UnsetType = msgspec.UNSET


class DryRunRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Whom to evaluate a rule for: a contact of the project, the conversation the event happens in (absent:
    the contact's open one, for a conversation or message event), and the event's own data."""

    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None = None
    event: EventData | None = None


class DryRun(msgspec.Struct, kw_only=True, frozen=True):
    """What a rule would do for an event now: its verdict, each condition's result and value, the actions
    that would run, and for a delayed rule the episode and due time."""

    rule_id: uuid.UUID
    event: Event
    contact_id: uuid.UUID
    #: The conversation the event happened in (null: an event without one).
    conversation_id: uuid.UUID | None
    #: Whether the rule's conditions hold: the root's result.
    matched: bool
    conditions: ConditionResult
    #: The actions that would run, as stored, in order (for a delayed rule, when it falls due and still
    #: holds); none when the conditions do not hold.
    actions: list[Action]
    #: A delayed rule that matched: the execution it would record (null otherwise).
    delayed: DelayedRun | None
    evaluated_at: datetime


def dry_run(
    conn: Connection[Any], project_id: uuid.UUID, rule_id: uuid.UUID, request: DryRunRequest, *, now: datetime
) -> DryRun:
    """Evaluate the project's rule ``rule_id`` now for ``request``'s contact, without acting (see the
    module): nothing it writes survives. 404 for another project's rule, contact or conversation (or one of
    another contact); 422 naming ``conversation_id`` for a conversation an event of the rule's type never has
    (or lacks), or ``event.<field>`` for data PostgreSQL cannot store."""
    rule = get_rule(conn, project_id, rule_id)
    contacts.get_contact(conn, project_id, request.contact_id)
    conversation_id = _conversation_of(conn, project_id, rule.event, request)
    payload = _payload(request.event)
    active = compile_rule(conn, rule)
    with rolled_back(conn):
        subject = insert_trigger(
            conn,
            project_id,
            rule.event,
            contact_id=request.contact_id,
            conversation_id=conversation_id,
            payload=payload,
            now=now,
        )
        conditions = trace(conn, project_id, active.conditions, subject.trigger_id)
    if conditions is None:  # erased meanwhile: the context has no contact
        raise NotFound("contact not found", field="contact_id")
    delayed = None
    if conditions.result and rule.execution_delay_minutes is not None:
        episode = rule_episode(active, subject)
        delayed = DelayedRun(
            episode_kind=episode.kind,
            episode_key=None if episode.kind == "event" else episode.key,
            due_at=due_time(conn, active, project_id, episode),
        )
    log.info(
        "rule dry run",
        extra={"project_id": str(project_id), "rule_id": str(rule_id), "matched": conditions.result},
    )
    return DryRun(
        rule_id=rule.id,
        event=rule.event,
        contact_id=request.contact_id,
        conversation_id=conversation_id,
        matched=conditions.result,
        conditions=conditions,
        actions=list(rule.actions) if conditions.result else [],
        delayed=delayed,
        evaluated_at=now,
    )


def _conversation_of(
    conn: Connection[Any], project_id: uuid.UUID, event: str, request: DryRunRequest
) -> uuid.UUID | None:
    """The conversation the event happens in: the one named (the contact's), else the contact's open one;
    none for an event that never has one."""
    if event not in IN_A_CONVERSATION:
        if request.conversation_id is not None:
            raise InvalidInput(f"a {event} event has no conversation", field="conversation_id")
        return None
    if request.conversation_id is None:
        found = conversations.open_conversation_id(conn, project_id, request.contact_id)
        if found is None:
            raise InvalidInput(
                f"a {event} event happens in a conversation, and the contact has no open one: name one",
                field="conversation_id",
            )
        return found
    conversation = conversations.get_conversation(conn, project_id, request.conversation_id)
    if conversation.contact_id != request.contact_id:
        raise NotFound("conversation not found for this contact", field="conversation_id")
    return conversation.id


def _payload(event: EventData | None) -> dict[str, Any]:
    """The event's data as its trigger stores it (422 naming the field PostgreSQL could not store)."""
    payload: dict[str, Any] = msgspec.to_builtins(event) if event is not None else {}
    validation.json_value(payload, "event")
    return payload
