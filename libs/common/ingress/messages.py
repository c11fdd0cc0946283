"""Ingress of messages: a contact's reply (``message.inbound``, which stops on reply), an agent's message in
the inbox (``message.human``, which stops on a human message), and the send lane's status reports
(``message.status``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.contracts.platform_events import HumanMessage, InboundMessage, MessageStatus
from libs.common.core import validation
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.ingress import provider_feedback
from libs.common.ingress.apply import EventResult, record, stop
from libs.common.platform import contacts, conversations, messages
from libs.common.platform.send_lane import StatusReport, report_status


def _message(message_id: uuid.UUID, kind: str, content: str | None) -> dict[str, Any]:
    return {"id": str(message_id), "type": kind, "content": content}


def inbound(
    conn: Connection[Any], project_id: uuid.UUID, event: InboundMessage, now: datetime
) -> EventResult:
    if not 1 <= len(event.provider_message_id) <= 200:
        raise InvalidInput("provider_message_id must be 1 to 200 characters", field="provider_message_id")
    if event.contact_id is None and event.phone is None:
        raise InvalidInput("give contact_id or phone", field="contact_id")
    contact_id = event.contact_id
    new_contact = False
    if contact_id is None:
        assert event.phone is not None
        contact, new_contact = contacts.upsert_contact(
            conn, project_id, validation.phone(event.phone), contacts.ContactFields()
        )
        contact_id = contact.id
    contacts.lock_contact(conn, project_id, contact_id)
    existing = messages.recorded_message(conn, project_id, event.provider_message_id)
    if existing is not None:
        return EventResult(
            type="message.inbound",
            applied=False,
            contact_id=contact_id,
            message_id=existing.message_id,
            conversation_id=existing.conversation_id,
        )
    conversation_id = _conversation_for(conn, project_id, contact_id, event.conversation_id, now)
    recorded = messages.record_inbound_message(
        conn,
        project_id,
        contact_id,
        conversation_id,
        provider_message_id=event.provider_message_id,
        body=event.body,
        media_url=event.media_url,
        media_kind=event.media_kind,
        now=now,
    )
    result = EventResult(
        type="message.inbound",
        contact_id=contact_id,
        conversation_id=conversation_id,
        message_id=recorded.message_id,
    )
    if new_contact:
        record(conn, project_id, "contact.created", result, now, contact_id=contact_id)
    message = _message(recorded.message_id, "incoming", event.body)
    record(  # before the stop path: a goal the reply meets converts the enrollment rather than stopping it
        conn,
        project_id,
        "message.created",
        result,
        now,
        contact_id=contact_id,
        conversation_id=conversation_id,
        message=message,
    )
    return stop(conn, project_id, contact_id, "reply", now, result)


def _conversation_for(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    wanted: uuid.UUID | None,
    now: datetime,
) -> uuid.UUID:
    """The conversation an inbound message belongs to: the one named, the open one, or a new one."""
    if wanted is not None:
        conversation = conversations.lock_conversation(conn, project_id, wanted)
        if conversation.contact_id != contact_id:
            raise NotFound("conversation not found for this contact", field="conversation_id")
        return wanted
    open_id = conversations.open_conversation_id(conn, project_id, contact_id)
    if open_id is not None:
        return open_id
    return conversations.create_conversation(conn, project_id, contact_id, now=now)[0].id


def human(conn: Connection[Any], project_id: uuid.UUID, event: HumanMessage, now: datetime) -> EventResult:
    conversation = conversations.lock_conversation(conn, project_id, event.conversation_id)
    if not contacts.share_contact(conn, project_id, conversation.contact_id):
        raise NotFound("the conversation's contact was erased", field="conversation_id")
    existing = messages.recorded_message(conn, project_id, event.provider_message_id)
    if existing is not None:
        return EventResult(
            type="message.human",
            applied=False,
            contact_id=conversation.contact_id,
            conversation_id=conversation.id,
            message_id=existing.message_id,
        )
    recorded = messages.record_human_message(
        conn,
        project_id,
        conversation.contact_id,
        conversation.id,
        conversation.number_id,
        provider_message_id=event.provider_message_id,
        body=event.body,
        now=now,
    )
    result = EventResult(
        type="message.human",
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        message_id=recorded.message_id,
    )
    message = _message(recorded.message_id, "outgoing", event.body)
    record(  # before the stop path, as a reply's
        conn,
        project_id,
        "message.created",
        result,
        now,
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        message=message,
    )
    return stop(conn, project_id, conversation.contact_id, "human_message", now, result, conversation.id)


def status(conn: Connection[Any], project_id: uuid.UUID, event: MessageStatus, now: datetime) -> EventResult:
    """A status report; a failure with the provider's code then acts by its class
    (:mod:`~libs.common.ingress.provider_feedback`)."""
    report = StatusReport(
        status=event.status,
        message_id=event.message_id,
        provider_message_id=event.provider_message_id,
        error=event.error,
        error_code=event.error_code,
    )
    requeued = provider_feedback.requeue_rate_limited(conn, project_id, report, now=now)
    if requeued is not None:
        return requeued
    state, applied = report_status(conn, project_id, report, now=now)
    result = EventResult(
        type="message.status",
        applied=applied,
        message_id=state.id,
        status=state.status,
        contact_id=state.contact_id,
        conversation_id=state.conversation_id,
    )
    if applied and state.status == "FAILED" and state.error_code is not None:
        provider_feedback.act(conn, project_id, state, result, now=now)
    return result
