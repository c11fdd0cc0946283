"""A rule's dry run: the rule evaluated now for a contact (and a conversation, and the event's own data),
without acting.

The product has no evaluator of conditions in Python: the SQL a tree compiles to
(:func:`~libs.common.rules.conditions.compile_conditions`) is the evaluator. So a dry run, in a savepoint it
always rolls back (:func:`~libs.common.core.effects.rolled_back`):

1. records the trigger an event of the rule's type would record (the same insert,
   :func:`~libs.common.rules.triggers.insert_trigger`, with the conversation's anchors of this moment and the
   event data the request gives);
2. reads, in ONE statement over that trigger's context (:func:`~libs.common.rules.matching.evaluate`),
   every node of the rule's tree compiled alone by the same compiler and written in with
   :func:`~libs.common.rules.matching.inline` (each leaf and each group), and each leaf's value (the
   attribute's own expression, as JSON: :func:`~libs.common.rules.conditions.value_of`). The root's text is
   the rule's predicate as the triggers service matches it: its result is the rule's verdict.

A delayed rule that matches also gets the episode and the due time :func:`~.executions.schedule` would
record (:func:`~.executions.rule_episode`, :func:`~.executions.due_time`). Nothing runs: no action, no
webhook, no message; the trigger row goes with the savepoint.

Results are never NULL: the compiler wraps every leaf in ``coalesce(..., false)`` (a value that is absent
makes a leaf false), a negative operator is ``NOT`` of its never-NULL positive, and a group is ``AND`` /
``OR`` of never-NULL children (an empty ``all`` is true, an empty ``any`` false). So each group's result is
exactly ``all`` / ``any`` of its children's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any, Final, Literal, get_args

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import MAX_LABEL_LENGTH, MAX_LABELS, Text
from libs.common.core import validation
from libs.common.core.effects import rolled_back
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.platform import contacts, conversations
from libs.common.rules.actions import Action
from libs.common.rules.conditions import Group, Leaf, Node, compile_conditions, value_of
from libs.common.rules.episodes import EpisodeKind
from libs.common.rules.executions import due_time, rule_episode
from libs.common.rules.matching import evaluate, inline
from libs.common.rules.rules import Event, compile_rule, get_rule
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


class LeafResult(msgspec.Struct, kw_only=True, frozen=True, tag_field="node", tag="leaf"):
    """A condition, the value it compared and whether it holds."""

    #: Where the node is in the tree, as errors name it (``conditions.all.1.any.0``).
    path: str
    attribute: str
    operator: str
    #: The condition's value (null: an operator without one).
    value: Any = None
    #: What the context holds for the attribute, as JSON (null: absent). A custom attribute's stored value
    #: whatever its type; for ``attribute_changed``, the event's change of the attribute (``{from, to}``).
    actual: Any = None
    result: bool


class GroupResult(msgspec.Struct, kw_only=True, frozen=True, tag_field="node", tag="group"):
    """An ``all`` / ``any`` group and whether it holds."""

    path: str
    kind: Literal["all", "any"]
    result: bool
    children: list[GroupResult | LeafResult]


#: A node of the evaluated tree.
ConditionResult = GroupResult | LeafResult


class DelayedRun(msgspec.Struct, kw_only=True, frozen=True):
    """The pending execution a delayed rule that matched would record."""

    episode_kind: EpisodeKind
    #: The episode's key (null for an ``event`` episode: every event is an episode of its own, keyed by its
    #: trigger, which a dry run does not keep).
    episode_key: str | None
    due_at: datetime


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


def trace(
    conn: Connection[Any], project_id: uuid.UUID, root: Node, trigger_id: int
) -> ConditionResult | None:
    """Every node of ``root`` compiled alone (and each leaf's value) over the context of the project's
    recorded trigger ``trigger_id``, in ONE statement: the tree with each result (None when the trigger's
    contact is gone)."""
    walked = list(_walk(root, "conditions"))
    predicates = [inline(conn, *compile_conditions(node)) for _, node in walked]
    values = [inline(conn, *value_of(node)) for _, node in walked if isinstance(node, Leaf)]
    found = evaluate(conn, project_id, trigger_id, predicates, values)
    if found is None:
        return None
    results, actuals = found
    return _tree(root, "conditions", iter(results), iter(actuals))


def _walk(node: Node, path: str) -> Iterator[tuple[str, Node]]:
    """Each node of a tree with its path, the parent before its children (the order :func:`_tree` reads)."""
    yield path, node
    if isinstance(node, Group):
        for i, child in enumerate(node.children):
            yield from _walk(child, f"{path}.{node.kind}.{i}")


def _tree(node: Node, path: str, results: Iterator[bool], actuals: Iterator[Any]) -> ConditionResult:
    result = next(results)
    if isinstance(node, Group):
        children = [
            _tree(child, f"{path}.{node.kind}.{i}", results, actuals) for i, child in enumerate(node.children)
        ]
        return GroupResult(path=path, kind=node.kind, result=result, children=children)
    return LeafResult(
        path=path,
        attribute=node.attribute,
        operator=node.operator,
        value=node.value,
        actual=next(actuals),
        result=result,
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
