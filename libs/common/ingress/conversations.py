"""Ingress of conversations: one created, its status changed (resolving it stops on a resolved
conversation), an inbox change (labels, assignee, team, priority, attributes, a private note)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.contracts.platform_events import (
    ConversationCreated,
    ConversationOpened,
    ConversationResolved,
    ConversationStatus,
    ConversationStatusChanged,
    ConversationUpdated,
)
from libs.common.core.errors import InvalidInput
from libs.common.ingress.apply import EventResult, record, stop
from libs.common.platform import conversations
from libs.common.platform.conversations import ConversationChange


def created(
    conn: Connection[Any], project_id: uuid.UUID, event: ConversationCreated, now: datetime
) -> EventResult:
    conversation, created = conversations.create_conversation(
        conn,
        project_id,
        event.contact_id,
        now=now,
        conversation_id=event.conversation_id,
        number_id=event.number_id,
        status=event.status,
    )
    result = EventResult(
        type="conversation.created",
        applied=created,
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        status=conversation.status,
    )
    if created:
        record(
            conn,
            project_id,
            "conversation.created",
            result,
            now,
            contact_id=conversation.contact_id,
            conversation_id=conversation.id,
        )
    return result


def status(
    conn: Connection[Any],
    project_id: uuid.UUID,
    event: ConversationOpened | ConversationStatusChanged | ConversationResolved,
    now: datetime,
) -> EventResult:
    """A conversation's new status; resolving it stops the contact's follow-ups that stop on a resolved
    conversation (tied to it or to none)."""
    status: ConversationStatus
    if isinstance(event, ConversationOpened):
        status, kind = "open", "conversation.opened"
    elif isinstance(event, ConversationResolved):
        status, kind = "resolved", "conversation.resolved"
    else:
        status, kind = event.status, "conversation.status_changed"
    conversation, previous = conversations.change_status(
        conn, project_id, event.conversation_id, status, now=now
    )
    result = EventResult(
        type=kind,
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        status=conversation.status,
    )
    if previous != status:
        changed = {"conversation.status": {"from": previous, "to": status}}
        by_status = {"open": ["conversation.opened"], "resolved": ["conversation.resolved"]}
        rule_events = ["conversation.updated", *by_status.get(status, [])]
        for rule_event in rule_events:
            record(
                conn,
                project_id,
                rule_event,
                result,
                now,
                contact_id=conversation.contact_id,
                conversation_id=conversation.id,
                changed=changed,
            )
    if status == "resolved" and previous != "resolved":
        return stop(
            conn, project_id, conversation.contact_id, "conversation_resolved", now, result, conversation.id
        )
    return result


def updated(
    conn: Connection[Any], project_id: uuid.UUID, event: ConversationUpdated, now: datetime
) -> EventResult:
    """An inbox change (labels, assignee, team, priority, attributes, a private note): conversation.updated
    with what really changed, unless an automation made it (``executed_by``)."""
    change = ConversationChange(
        labels=event.labels,
        assignee=event.assignee,
        team=event.team,
        priority=event.priority,
        attributes=event.attributes,
    )
    conversation, changed = conversations.update_conversation(
        conn, project_id, event.conversation_id, change, now=now
    )
    if event.private_note is not None:
        if not 1 <= len(event.private_note.strip()) <= 10_000:
            raise InvalidInput("private_note must be 1 to 10000 characters", field="private_note")
        conversations.add_private_note(
            conn,
            project_id,
            conversation.contact_id,
            conversation.id,
            event.private_note,
            executed_by=event.executed_by or "platform",
            now=now,
        )
        changed["conversation.private_note"] = {"from": None, "to": event.private_note}
    result = EventResult(
        type="conversation.updated",
        applied=bool(changed),
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        status=conversation.status,
    )
    if changed and event.executed_by is None:
        labels = changed.get("conversation.labels") or {"from": [], "to": []}
        record(  # once for the change, with every label it added and removed
            conn,
            project_id,
            "conversation.updated",
            result,
            now,
            contact_id=conversation.contact_id,
            conversation_id=conversation.id,
            changed=changed,
            labels_added=sorted(set(labels["to"]) - set(labels["from"])),
            labels_removed=sorted(set(labels["from"]) - set(labels["to"])),
        )
    return result
