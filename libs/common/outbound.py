"""The one shared send function: every outbound message the engine creates goes through here."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.sql import load_queries

QUERIES = load_queries("libs.common", "outbound.sql")

#: Priority of follow-up messages in the send lane (lower is sooner).
FOLLOWUP_PRIORITY = 5


class ConversationBusy(Exception):
    """The contact's open conversation is locked by another transaction; retry soon."""


@dataclass(frozen=True)
class OutboundMessage:
    project_id: uuid.UUID
    contact_id: uuid.UUID
    body: str
    source: str
    priority: int = FOLLOWUP_PRIORITY
    media_url: str | None = None
    media_kind: str | None = None
    number_id: uuid.UUID | None = None
    #: Thread into this conversation when it is still open (else the contact's newest open one).
    conversation_id: uuid.UUID | None = None
    followup_enrollment_id: uuid.UUID | None = None
    followup_step_index: int | None = None


@dataclass(frozen=True)
class QueuedMessage:
    message_id: uuid.UUID
    conversation_id: uuid.UUID


def queue_contact_message(conn: Connection[Any], message: OutboundMessage, *, now: datetime) -> QueuedMessage:
    """Queue a message for the send lane, in the caller's transaction.

    Threads it into the contact's open conversation (locked SKIP LOCKED: busy raises
    :class:`ConversationBusy`) or a new one; writes the message row (QUEUED), its status event, the
    ``message.queued`` outbox event and a usage row.
    """
    params: dict[str, Any] = {
        "project_id": message.project_id,
        "contact_id": message.contact_id,
        "conversation_id": message.conversation_id,
        "now": now,
    }
    row = conn.execute(QUERIES["lock_open_conversation"], params).fetchone()
    if row is None:
        if conn.execute(QUERIES["open_conversation_exists"], params).fetchone():
            raise ConversationBusy()
        row = conn.execute(
            QUERIES["insert_conversation"], params | {"number_id": message.number_id}
        ).fetchone()
        assert row is not None
    conversation_id: uuid.UUID = row[0]
    number_id = message.number_id or row[1]
    # the id is made here, so nothing waits for the insert's result: under a pipeline the writes that
    # follow travel with it in one round trip
    message_id = uuid.uuid4()
    params |= {
        "id": message_id,
        "conversation_id": conversation_id,
        "number_id": number_id,
        "source": message.source,
        "priority": message.priority,
        "body": message.body,
        "media_url": message.media_url,
        "media_kind": message.media_kind,
        "followup_enrollment_id": message.followup_enrollment_id,
        "followup_step_index": message.followup_step_index,
    }
    conn.execute(QUERIES["insert_queued_message"], params)
    return QueuedMessage(message_id, conversation_id)
