"""Conversations: their lifecycle (status, ``status_changed_at``, ``waiting_since``) and the follow-up
shortcut ("in 24 hours, if there is no reply, send this")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.db import map_errors
from libs.common.enrollments import Enrollment, EnrollRequest, enroll
from libs.common.errors import AlreadyExists, InvalidInput, NotFound
from libs.common.sequences import MAX_DELAY_SECONDS, MessageStep, StopFlags
from libs.common.sql import load_queries
from libs.common.stops import Stopped, stop_followups_for_contact

QUERIES = load_queries("libs.common", "conversations.sql")

ConversationStatus = Literal["open", "pending", "snoozed", "resolved"]


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


class FollowUpRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A one-off follow-up in a conversation: after ``delay_seconds``, send ``text`` (unless a reply came)."""

    text: str
    delay_seconds: int = 86400
    only_if_no_reply: bool = True
    media_url: str | None = None
    media_kind: Literal["image", "video", "audio", "document"] | None = None
    variables: dict[str, Any] = msgspec.field(default_factory=dict)
    dedupe_key: str | None = None


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
) -> tuple[Conversation, Stopped | None]:
    """Set a conversation's status (``status_changed_at`` moves only on a real change).

    Resolving clears ``waiting_since`` and stops the contact's follow-ups that stop on a resolved
    conversation, in this transaction (the conversation is locked first).
    """
    current = lock_conversation(conn, project_id, conversation_id)
    with conn.cursor(row_factory=class_row(Conversation)) as cur:
        params = {"project_id": project_id, "id": conversation_id, "status": status, "now": now}
        changed = cur.execute(QUERIES["set_status"], params).fetchone()
    assert changed is not None
    stopped = None
    if status == "resolved" and current.status != "resolved":
        stopped = stop_followups_for_contact(
            conn,
            project_id,
            current.contact_id,
            "conversation_resolved",
            now=now,
            conversation_id=conversation_id,
        )
    return changed, stopped


def follow_up(
    conn: Connection[Any],
    project_id: uuid.UUID,
    conversation_id: uuid.UUID,
    request: FollowUpRequest,
    *,
    now: datetime,
) -> tuple[Enrollment, bool]:
    """A one-off follow-up for the conversation's contact, threaded into this conversation."""
    if not 0 <= request.delay_seconds <= MAX_DELAY_SECONDS:
        raise InvalidInput(f"delay_seconds must be 0 to {MAX_DELAY_SECONDS}", field="delay_seconds")
    conversation = get_conversation(conn, project_id, conversation_id)
    try:
        return _enroll_one_off(conn, project_id, conversation, request, now=now)
    except InvalidInput as exc:
        # the one-off's only step is this request: name its fields (``text``), not ``steps.0.text``
        if exc.field is not None and exc.field.startswith(_STEP_FIELD):
            raise type(exc)(exc.message, field=exc.field.removeprefix(_STEP_FIELD)) from None
        raise


_STEP_FIELD = "steps.0."


def _enroll_one_off(
    conn: Connection[Any],
    project_id: uuid.UUID,
    conversation: Conversation,
    request: FollowUpRequest,
    *,
    now: datetime,
) -> tuple[Enrollment, bool]:
    step = MessageStep(
        text=request.text,
        delay_seconds=request.delay_seconds,
        media_url=request.media_url,
        media_kind=request.media_kind,
        only_if=["no_reply_since_enrollment"] if request.only_if_no_reply else [],
    )
    return enroll(
        conn,
        project_id,
        EnrollRequest(
            contact_id=conversation.contact_id,
            steps=[step],
            stop_on=StopFlags(reply=request.only_if_no_reply),
            conversation_id=conversation.id,
            number_id=conversation.number_id,
            variables=request.variables,
            dedupe_key=request.dedupe_key,
        ),
        now=now,
        source="conversation",
    )
