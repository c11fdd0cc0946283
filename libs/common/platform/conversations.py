"""Conversations: their lifecycle (status, ``status_changed_at``, ``waiting_since``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from libs.common.contracts.platform_events import ConversationStatus
from libs.common.core import validation
from libs.common.core.db import map_errors
from libs.common.core.errors import AlreadyExists, InvalidInput, NotFound
from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.platform", "conversations.sql")


#: A conversation's priority.
Priority = Literal["low", "medium", "high", "urgent"]


class Conversation(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    contact_id: uuid.UUID
    number_id: uuid.UUID | None
    status: str
    status_changed_at: datetime
    waiting_since: datetime | None
    priority: str | None
    assignee: str | None
    team: str | None
    labels: list[str]
    inbox: str | None
    attributes: dict[str, Any]
    snoozed_until: datetime | None
    last_incoming_message_id: uuid.UUID | None
    last_outgoing_message_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime


_CONSTRAINTS = {
    "conversations_pkey": lambda: AlreadyExists("the conversation exists", field="conversation_id")
}


def get_conversation(
    conn: Connection[Any], project_id: uuid.UUID, conversation_id: uuid.UUID
) -> Conversation:
    with conn.cursor(row_factory=class_row(Conversation)) as cur:
        found = cur.execute(
            QUERIES["get_conversation"], {"project_id": project_id, "id": conversation_id}
        ).fetchone()
    if found is None:
        raise NotFound("conversation not found", field="conversation_id")
    return found


def lock_conversation(
    conn: Connection[Any], project_id: uuid.UUID, conversation_id: uuid.UUID
) -> Conversation:
    """Lock a conversation for an inbox event (the stop paths of inbox events lock the conversation)."""
    with conn.cursor(row_factory=class_row(Conversation)) as cur:
        params = {"project_id": project_id, "id": conversation_id}
        found = cur.execute(QUERIES["lock_conversation"], params).fetchone()
    if found is None:
        raise NotFound("conversation not found", field="conversation_id")
    return found


def create_conversation(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    *,
    now: datetime,
    conversation_id: uuid.UUID | None = None,
    number_id: uuid.UUID | None = None,
    status: ConversationStatus = "open",
) -> tuple[Conversation, bool]:
    """Create a conversation for a contact of the project; returns it and whether it was created.

    A repeat with the same ``conversation_id`` for the same contact returns the existing conversation
    (created False); an id taken by another contact or project is a conflict.
    """
    params = {
        "project_id": project_id,
        "id": conversation_id or uuid.uuid4(),
        "contact_id": contact_id,
        "number_id": number_id,
        "status": status,
        "now": now,
    }
    with map_errors(_CONSTRAINTS), conn.cursor(row_factory=class_row(Conversation)) as cur:
        created = cur.execute(QUERIES["insert_conversation"], params).fetchone()
    if created is not None:
        return created, True
    if conversation_id is not None:
        with conn.cursor(row_factory=class_row(Conversation)) as cur:
            existing = cur.execute(QUERIES["get_conversation"], params).fetchone()
        if existing is not None and existing.contact_id == contact_id:
            return existing, False
    found = conn.execute(QUERIES["contact_and_number_exist"], params).fetchone()
    assert found is not None
    contact_found, number_found = found
    if not contact_found:
        raise NotFound("contact not found", field="contact_id")
    if not number_found:
        raise NotFound("number not found", field="number_id")
    raise AlreadyExists("the conversation exists", field="conversation_id")


def change_status(
    conn: Connection[Any],
    project_id: uuid.UUID,
    conversation_id: uuid.UUID,
    status: ConversationStatus,
    *,
    now: datetime,
    snoozed_until: datetime | None = None,
) -> tuple[Conversation, str]:
    """Set a conversation's status; returns it and its status before (the conversation is locked first).

    ``status_changed_at`` moves only on a real change; resolving clears ``waiting_since``; ``snoozed_until``
    is kept with the snoozed status only.
    """
    previous = lock_conversation(conn, project_id, conversation_id).status
    with conn.cursor(row_factory=class_row(Conversation)) as cur:
        params = {
            "project_id": project_id,
            "id": conversation_id,
            "status": status,
            "snoozed_until": snoozed_until,
            "now": now,
        }
        changed = cur.execute(QUERIES["set_conversation_status"], params).fetchone()
    assert changed is not None
    return changed, previous


def open_conversation_id(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID
) -> uuid.UUID | None:
    """The contact's newest conversation that is not resolved."""
    row = conn.execute(
        QUERIES["open_conversation"], {"project_id": project_id, "contact_id": contact_id}
    ).fetchone()
    return row[0] if row is not None else None


class ConversationChange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A change to a conversation's inbox fields: absent fields are kept; ``attributes`` are merged (a null
    value removes the key)."""

    labels: list[str] | msgspec.UnsetType = msgspec.UNSET
    add_labels: list[str] = msgspec.field(default_factory=list)
    remove_labels: list[str] = msgspec.field(default_factory=list)
    assignee: str | msgspec.UnsetType | None = msgspec.UNSET
    team: str | msgspec.UnsetType | None = msgspec.UNSET
    priority: Priority | msgspec.UnsetType | None = msgspec.UNSET
    attributes: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


#: What a change did, by attribute name (``conversation.labels``): ``{"from": old, "to": new}``.
Changed = dict[str, dict[str, Any]]


def update_conversation(
    conn: Connection[Any],
    project_id: uuid.UUID,
    conversation_id: uuid.UUID,
    change: ConversationChange,
    *,
    now: datetime,
) -> tuple[Conversation, Changed]:
    """Apply ``change`` to a conversation (locked first); returns it and what really changed."""
    return send_conversation_change(conn, project_id, conversation_id, change, now=now)()


def send_conversation_change(
    conn: Connection[Any],
    project_id: uuid.UUID,
    conversation_id: uuid.UUID,
    change: ConversationChange,
    *,
    now: datetime,
) -> Callable[[], tuple[Conversation, Changed]]:
    """Lock the conversation (a read), then send ``change`` to it (a write); the call returned reads the
    conversation as changed, and what really changed. In a pipeline, the write goes out with the statements
    after it, and is read only when that call is made."""
    current = lock_conversation(conn, project_id, conversation_id)
    labels = list(current.labels) if change.labels is msgspec.UNSET else _labels(change.labels, "labels")
    for label in _labels(change.add_labels, "add_labels"):
        if label not in labels:
            labels.append(label)
    removed = set(_labels(change.remove_labels, "remove_labels"))
    labels = sorted(label for label in labels if label not in removed)
    attributes = dict(current.attributes)
    if change.attributes is not msgspec.UNSET:
        validation.json_value(change.attributes, "attributes")
        for key, value in change.attributes.items():
            if value is None:
                attributes.pop(key, None)
            else:
                attributes[key] = value
    after = {
        "labels": labels,
        "assignee": _kept(change.assignee, current.assignee, "assignee"),
        "team": _kept(change.team, current.team, "team"),
        "priority": current.priority if change.priority is msgspec.UNSET else change.priority,
        "attributes": attributes,
    }
    before = {name: getattr(current, name) for name in after}
    changed: Changed = {}
    for name in ("labels", "assignee", "team", "priority"):
        old = sorted(before[name]) if name == "labels" else before[name]
        if old != after[name]:
            changed[f"conversation.{name}"] = {"from": old, "to": after[name]}
    for key in sorted(set(before["attributes"]) | set(attributes)):
        if before["attributes"].get(key) != attributes.get(key):
            changed[f"conversation.attributes.{key}"] = {
                "from": before["attributes"].get(key),
                "to": attributes.get(key),
            }
    if not changed:
        return lambda: (current, changed)
    params = after | {
        "attributes": Jsonb(attributes),
        "project_id": project_id,
        "id": conversation_id,
        "now": now,
    }
    cur = conn.cursor(row_factory=class_row(Conversation))
    cur.execute(QUERIES["update_conversation"], params)

    def updated() -> tuple[Conversation, Changed]:
        with cur:
            row = cur.fetchone()
        assert row is not None  # locked above, in this transaction
        return row, changed

    return updated


def _labels(values: list[str], field: str) -> list[str]:
    return [validation.tag(value, f"{field}.{i}") for i, value in enumerate(values)]


def _kept(value: str | msgspec.UnsetType | None, current: str | None, field: str) -> str | None:
    """A new assignee or team (1 to 200 characters, or None to clear), else the current one."""
    if value is msgspec.UNSET:
        return current
    if value is not None and not 1 <= len(validation.text(value.strip(), field)) <= 200:
        raise InvalidInput(f"{field} must be 1 to 200 characters", field=field)
    return value.strip() if value is not None else None


def add_private_note(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID,
    text: str,
    *,
    executed_by: str,
    now: datetime,
) -> None:
    """A private note on the contact's conversation (in its timeline, never sent to the contact)."""
    data = {
        "conversation_id": str(conversation_id),
        "text": validation.text(text, "text"),
        "executed_by": executed_by,
    }
    conn.execute(
        QUERIES["insert_private_note"],
        {"project_id": project_id, "contact_id": contact_id, "data": Jsonb(data), "now": now},
    )
