"""Conversations: their lifecycle (status, ``status_changed_at``, ``waiting_since``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.contracts.platform_events import ConversationStatus
from libs.common.core.db import map_errors
from libs.common.core.errors import AlreadyExists, NotFound
from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.platform", "conversations.sql")


class Conversation(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    contact_id: uuid.UUID
    number_id: uuid.UUID | None
    status: str
    status_changed_at: datetime
    waiting_since: datetime | None
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
) -> tuple[Conversation, str]:
    """Set a conversation's status; returns it and its status before (the conversation is locked first).

    ``status_changed_at`` moves only on a real change; resolving clears ``waiting_since``.
    """
    previous = lock_conversation(conn, project_id, conversation_id).status
    with conn.cursor(row_factory=class_row(Conversation)) as cur:
        params = {"project_id": project_id, "id": conversation_id, "status": status, "now": now}
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
