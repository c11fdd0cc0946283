"""Platform events: what happens on the messaging platform that the engine must know about.

They arrive two ways that call the same function, :func:`apply_event`: ``POST /v1/events`` and the
``platform_event`` ingress actor on RabbitMQ. Each event is applied in one transaction, and the stop
paths it triggers run inside that transaction (see :mod:`libs.common.stops`).

    message.inbound              a contact wrote (idempotent on provider_message_id): stops on reply
    message.human                an agent wrote in the inbox: stops on human message
    message.status               the send lane reports SENT / DELIVERED / READ / FAILED (monotonic)
    contact.opted_out / opted_in
    contact.erased               privacy erasure: nothing left that identifies the person
    lead.created / lead.status_changed / lead.closed;  deal.stage_changed
    conversation.created / opened / status_changed / resolved
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any, Literal

import msgspec
from psycopg import Connection

from libs.common import validation
from libs.common.contacts import ContactFields, upsert_contact
from libs.common.conversations import (
    ConversationStatus,
    change_status,
    create_conversation,
    lock_conversation,
)
from libs.common.errors import AlreadyExists, InvalidInput, NotFound
from libs.common.outbox import write_event
from libs.common.send_lane import ReportedStatus, StatusReport, report_status
from libs.common.sql import load_queries
from libs.common.stops import StopFlag, stop_followups_for_contact

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common", "platform_events.sql")


class _Event(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    pass


class InboundMessage(_Event, kw_only=True, tag="message.inbound"):
    """A message from a contact, by ``contact_id`` or by ``phone`` (a new phone creates the contact)."""

    provider_message_id: str
    contact_id: uuid.UUID | None = None
    phone: str | None = None
    conversation_id: uuid.UUID | None = None
    body: str | None = None
    media_url: str | None = None
    media_kind: Literal["image", "video", "audio", "document"] | None = None


class HumanMessage(_Event, kw_only=True, tag="message.human"):
    """An agent's message in a conversation (sent by the platform, not by the engine)."""

    conversation_id: uuid.UUID
    provider_message_id: str | None = None
    body: str | None = None


class MessageStatus(_Event, kw_only=True, tag="message.status"):
    status: ReportedStatus
    message_id: uuid.UUID | None = None
    provider_message_id: str | None = None
    error: str | None = None


class ContactOptedOut(_Event, kw_only=True, tag="contact.opted_out"):
    contact_id: uuid.UUID


class ContactOptedIn(_Event, kw_only=True, tag="contact.opted_in"):
    contact_id: uuid.UUID


class ContactErased(_Event, kw_only=True, tag="contact.erased"):
    contact_id: uuid.UUID


class LeadCreated(_Event, kw_only=True, tag="lead.created"):
    contact_id: uuid.UUID
    lead_id: uuid.UUID | None = None
    status: str = "open"


class LeadStatusChanged(_Event, kw_only=True, tag="lead.status_changed"):
    lead_id: uuid.UUID
    status: str


class LeadClosed(_Event, kw_only=True, tag="lead.closed"):
    lead_id: uuid.UUID
    status: Literal["won", "lost", "closed"] = "closed"


class DealStageChanged(_Event, kw_only=True, tag="deal.stage_changed"):
    deal_id: uuid.UUID
    stage: str
    contact_id: uuid.UUID | None = None
    lead_id: uuid.UUID | None = None


class ConversationCreated(_Event, kw_only=True, tag="conversation.created"):
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None = None
    number_id: uuid.UUID | None = None
    status: ConversationStatus = "open"


class ConversationOpened(_Event, kw_only=True, tag="conversation.opened"):
    conversation_id: uuid.UUID


class ConversationStatusChanged(_Event, kw_only=True, tag="conversation.status_changed"):
    conversation_id: uuid.UUID
    status: ConversationStatus


class ConversationResolved(_Event, kw_only=True, tag="conversation.resolved"):
    conversation_id: uuid.UUID


PlatformEvent = (
    InboundMessage
    | HumanMessage
    | MessageStatus
    | ContactOptedOut
    | ContactOptedIn
    | ContactErased
    | LeadCreated
    | LeadStatusChanged
    | LeadClosed
    | DealStageChanged
    | ConversationCreated
    | ConversationOpened
    | ConversationStatusChanged
    | ConversationResolved
)


class EventResult(msgspec.Struct, kw_only=True):
    """What applying an event did."""

    type: str
    #: False when the event had already been applied (a repeated provider message id, a repeated status).
    applied: bool = True
    contact_id: uuid.UUID | None = None
    conversation_id: uuid.UUID | None = None
    message_id: uuid.UUID | None = None
    lead_id: uuid.UUID | None = None
    deal_id: uuid.UUID | None = None
    status: str | None = None
    stopped_enrollment_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    cancelled_message_ids: list[uuid.UUID] = msgspec.field(default_factory=list)


def apply_event(
    conn: Connection[Any], project_id: uuid.UUID, event: PlatformEvent, *, now: datetime
) -> EventResult:
    """Apply one platform event in the caller's transaction."""
    kind = type(event).__struct_config__.tag
    assert isinstance(kind, str)
    result: EventResult = _HANDLERS[type(event)](conn, project_id, event, now)
    log.info(
        "platform event",
        extra={
            "project_id": str(project_id),
            "event_type": kind,
            "applied": result.applied,
            "contact_id": str(result.contact_id) if result.contact_id else None,
            "message_id": str(result.message_id) if result.message_id else None,
            "stopped": len(result.stopped_enrollment_ids),
            "cancelled": len(result.cancelled_message_ids),
        },
    )
    return result


def require_project(conn: Connection[Any], project_id: uuid.UUID) -> None:
    """404 for an unknown project: the broker path has no API key that already proved the project."""
    if conn.execute(QUERIES["project_exists"], {"project_id": project_id}).fetchone() is None:
        raise NotFound("project not found", field="project_id")


def _lock_contact(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, query: str = "lock_contact"
) -> None:
    """Lock the contact (stop paths of contact events); 404 for another project's or an erased one."""
    if conn.execute(QUERIES[query], {"project_id": project_id, "id": contact_id}).fetchone() is None:
        raise NotFound("contact not found", field="contact_id")


def _stop(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    flag: StopFlag,
    now: datetime,
    result: EventResult,
    conversation_id: uuid.UUID | None = None,
) -> EventResult:
    stopped = stop_followups_for_contact(
        conn, project_id, contact_id, flag, now=now, conversation_id=conversation_id
    )
    result.stopped_enrollment_ids = stopped.enrollment_ids
    result.cancelled_message_ids = stopped.cancelled_message_ids
    return result


def _inbound(
    conn: Connection[Any], project_id: uuid.UUID, event: InboundMessage, now: datetime
) -> EventResult:
    if not 1 <= len(event.provider_message_id) <= 200:
        raise InvalidInput("provider_message_id must be 1 to 200 characters", field="provider_message_id")
    if event.contact_id is None and event.phone is None:
        raise InvalidInput("give contact_id or phone", field="contact_id")
    contact_id = event.contact_id
    if contact_id is None:
        assert event.phone is not None
        contact, _ = upsert_contact(conn, project_id, validation.phone(event.phone), ContactFields())
        contact_id = contact.id
    _lock_contact(conn, project_id, contact_id)
    params: dict[str, Any] = {
        "project_id": project_id,
        "contact_id": contact_id,
        "provider_message_id": event.provider_message_id,
    }
    existing = conn.execute(QUERIES["message_by_provider_id"], params).fetchone()
    if existing is not None:
        return EventResult(
            type="message.inbound",
            applied=False,
            contact_id=contact_id,
            message_id=existing[0],
            conversation_id=existing[1],
        )
    conversation_id = _conversation_for(conn, project_id, contact_id, event.conversation_id, now)
    params |= {
        "conversation_id": conversation_id,
        "body": event.body,
        "media_url": event.media_url,
        "media_kind": event.media_kind,
        "now": now,
    }
    row = conn.execute(QUERIES["insert_inbound_message"], params).fetchone()
    assert row is not None
    result = EventResult(
        type="message.inbound", contact_id=contact_id, conversation_id=conversation_id, message_id=row[0]
    )
    return _stop(conn, project_id, contact_id, "reply", now, result)


def _conversation_for(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    wanted: uuid.UUID | None,
    now: datetime,
) -> uuid.UUID:
    """The conversation an inbound message belongs to: the one named, the open one, or a new one."""
    if wanted is not None:
        conversation = lock_conversation(conn, project_id, wanted)
        if conversation.contact_id != contact_id:
            raise NotFound("conversation not found for this contact", field="conversation_id")
        return wanted
    row = conn.execute(
        QUERIES["open_conversation"], {"project_id": project_id, "contact_id": contact_id}
    ).fetchone()
    if row is not None:
        conversation_id: uuid.UUID = row[0]
        return conversation_id
    return create_conversation(conn, project_id, contact_id, now=now)[0].id


def _human(conn: Connection[Any], project_id: uuid.UUID, event: HumanMessage, now: datetime) -> EventResult:
    conversation = lock_conversation(conn, project_id, event.conversation_id)
    contact = {"project_id": project_id, "id": conversation.contact_id}
    if conn.execute(QUERIES["share_contact"], contact).fetchone() is None:
        raise NotFound("the conversation's contact was erased", field="conversation_id")
    params = {
        "project_id": project_id,
        "contact_id": conversation.contact_id,
        "conversation_id": conversation.id,
        "number_id": conversation.number_id,
        "provider_message_id": event.provider_message_id,
        "body": event.body,
        "now": now,
    }
    if event.provider_message_id is not None:
        existing = conn.execute(QUERIES["message_by_provider_id"], params).fetchone()
        if existing is not None:
            return EventResult(
                type="message.human",
                applied=False,
                contact_id=conversation.contact_id,
                conversation_id=conversation.id,
                message_id=existing[0],
            )
    row = conn.execute(QUERIES["insert_human_message"], params).fetchone()
    assert row is not None
    result = EventResult(
        type="message.human",
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        message_id=row[0],
    )
    return _stop(conn, project_id, conversation.contact_id, "human_message", now, result, conversation.id)


def _status(conn: Connection[Any], project_id: uuid.UUID, event: MessageStatus, now: datetime) -> EventResult:
    report = StatusReport(
        status=event.status,
        message_id=event.message_id,
        provider_message_id=event.provider_message_id,
        error=event.error,
    )
    state, applied = report_status(conn, project_id, report, now=now)
    return EventResult(type="message.status", applied=applied, message_id=state.id, status=state.status)


def _opted_out(
    conn: Connection[Any], project_id: uuid.UUID, event: ContactOptedOut, now: datetime
) -> EventResult:
    _lock_contact(conn, project_id, event.contact_id)
    params = {"project_id": project_id, "id": event.contact_id, "now": now}
    changed = conn.execute(QUERIES["opt_out"], params).fetchone() is not None
    result = EventResult(type="contact.opted_out", applied=changed, contact_id=event.contact_id)
    return _stop(conn, project_id, event.contact_id, "opt_out", now, result)


def _opted_in(
    conn: Connection[Any], project_id: uuid.UUID, event: ContactOptedIn, now: datetime
) -> EventResult:
    _lock_contact(conn, project_id, event.contact_id)
    params = {"project_id": project_id, "id": event.contact_id, "now": now}
    changed = conn.execute(QUERIES["opt_in"], params).fetchone() is not None
    return EventResult(type="contact.opted_in", applied=changed, contact_id=event.contact_id)


def _erased(conn: Connection[Any], project_id: uuid.UUID, event: ContactErased, now: datetime) -> EventResult:
    """Privacy erasure: stop everything, delete the messages, anonymise the contact and its follow-ups."""
    _lock_contact(conn, project_id, event.contact_id, "lock_contact_for_erasure")
    result = _stop(
        conn,
        project_id,
        event.contact_id,
        "any",
        now,
        EventResult(type="contact.erased", contact_id=event.contact_id),
    )
    conn.execute(QUERIES["erase_contact"], {"project_id": project_id, "id": event.contact_id, "now": now})
    write_event(
        conn,
        project_id=project_id,
        type="contact.erased",
        aggregate_type="contact",
        aggregate_id=event.contact_id,
        data={"contact_id": str(event.contact_id)},
        occurred_at=now,
    )
    return result


def _lead_created(
    conn: Connection[Any], project_id: uuid.UUID, event: LeadCreated, now: datetime
) -> EventResult:
    _lock_contact(conn, project_id, event.contact_id)
    lead_id = event.lead_id or uuid.uuid4()
    params = {
        "project_id": project_id,
        "id": lead_id,
        "contact_id": event.contact_id,
        "status": event.status,
        "now": now,
    }
    applied = conn.execute(QUERIES["insert_lead"], params).fetchone() is not None
    if not applied:  # a repeat is fine; an id held by another contact or project is not
        holder = conn.execute(QUERIES["lead_contact"], params).fetchone()
        if holder is None or holder[0] != event.contact_id:
            raise AlreadyExists("a lead with this id exists", field="lead_id")
    return EventResult(
        type="lead.created",
        applied=applied,
        contact_id=event.contact_id,
        lead_id=lead_id,
        status=event.status,
    )


def _lead_status(
    conn: Connection[Any], project_id: uuid.UUID, event: LeadStatusChanged | LeadClosed, now: datetime
) -> EventResult:
    """A lead's new status; the lead-closed stop path runs when the lead goes from open to closed.

    A repeated event changes nothing (applied false) and stops nothing: follow-ups started after the lead
    closed are not stopped by a late duplicate of the close. A status change other than a close reopens a
    closed lead.
    """
    closed = isinstance(event, LeadClosed)
    kind = "lead.closed" if closed else "lead.status_changed"
    params = {"project_id": project_id, "id": event.lead_id}
    lead = conn.execute(QUERIES["lead_contact"], params).fetchone()
    if lead is None:
        raise NotFound("lead not found", field="lead_id")
    contact_id: uuid.UUID = lead[0]
    _lock_contact(conn, project_id, contact_id)
    current = conn.execute(QUERIES["lock_lead"], params).fetchone()
    assert current is not None  # leads are deleted only with their contact, which is locked
    status, was_closed = current
    # a close applies to an open lead (or changes how it closed); another status change applies when the
    # status differs, and reopens a closed lead
    applied = status != event.status or (closed and not was_closed)
    result = EventResult(
        type=kind, applied=applied, contact_id=contact_id, lead_id=event.lead_id, status=event.status
    )
    if not applied:
        return result
    conn.execute(QUERIES["set_lead_status"], params | {"status": event.status, "closed": closed, "now": now})
    if closed and not was_closed:
        return _stop(conn, project_id, contact_id, "lead_closed", now, result)
    return result


def _deal_stage(
    conn: Connection[Any], project_id: uuid.UUID, event: DealStageChanged, now: datetime
) -> EventResult:
    params = {
        "project_id": project_id,
        "id": event.deal_id,
        "contact_id": event.contact_id,
        "lead_id": event.lead_id,
        "stage": event.stage,
        "now": now,
    }
    if event.lead_id is not None and conn.execute(QUERIES["lead_exists"], params).fetchone() is None:
        raise NotFound("lead not found", field="lead_id")
    row = conn.execute(QUERIES["set_deal_stage"], params).fetchone()
    if row is None and event.contact_id is not None:
        row = conn.execute(QUERIES["insert_deal"], params).fetchone()
    if row is None:
        raise NotFound("deal not found; give contact_id to create it", field="contact_id")
    return EventResult(
        type="deal.stage_changed", contact_id=row[0], deal_id=event.deal_id, status=event.stage
    )


def _conversation_created(
    conn: Connection[Any], project_id: uuid.UUID, event: ConversationCreated, now: datetime
) -> EventResult:
    conversation, created = create_conversation(
        conn,
        project_id,
        event.contact_id,
        now=now,
        conversation_id=event.conversation_id,
        number_id=event.number_id,
        status=event.status,
    )
    return EventResult(
        type="conversation.created",
        applied=created,
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        status=conversation.status,
    )


def _conversation_status(
    conn: Connection[Any],
    project_id: uuid.UUID,
    event: ConversationOpened | ConversationStatusChanged | ConversationResolved,
    now: datetime,
) -> EventResult:
    status: ConversationStatus
    if isinstance(event, ConversationOpened):
        status, kind = "open", "conversation.opened"
    elif isinstance(event, ConversationResolved):
        status, kind = "resolved", "conversation.resolved"
    else:
        status, kind = event.status, "conversation.status_changed"
    conversation, stopped = change_status(conn, project_id, event.conversation_id, status, now=now)
    result = EventResult(
        type=kind,
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        status=conversation.status,
    )
    if stopped is not None:
        result.stopped_enrollment_ids = stopped.enrollment_ids
        result.cancelled_message_ids = stopped.cancelled_message_ids
    return result


_HANDLERS: dict[type[Any], Any] = {
    InboundMessage: _inbound,
    HumanMessage: _human,
    MessageStatus: _status,
    ContactOptedOut: _opted_out,
    ContactOptedIn: _opted_in,
    ContactErased: _erased,
    LeadCreated: _lead_created,
    LeadStatusChanged: _lead_status,
    LeadClosed: _lead_status,
    DealStageChanged: _deal_stage,
    ConversationCreated: _conversation_created,
    ConversationOpened: _conversation_status,
    ConversationStatusChanged: _conversation_status,
    ConversationResolved: _conversation_status,
}
