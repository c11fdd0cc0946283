"""Ingress: one platform event, applied in one transaction: the platform change, then the stop paths, then
the triggers of the rules that listen for it (recorded only when the project has an active rule for the
event; see :mod:`libs.common.rules.triggers`). Contact changes made through the API go the same way
(:mod:`libs.common.ingress.contact_changes`).

Events arrive two ways that call the same function: ``POST /v1/events`` and the ``platform_event`` ingress
actor on RabbitMQ (both through :func:`handle_event`, which commits and then counts).

    message.inbound              a contact wrote (idempotent on provider_message_id): stops on reply
    message.human                an agent wrote in the inbox: stops on human message
    message.status               the send lane reports SENT / DELIVERED / READ / FAILED (monotonic)
    contact.opted_out / opted_in
    contact.erased               privacy erasure: every context erases its part
    lead.created / lead.status_changed / lead.closed;  deal.stage_changed
    conversation.created / opened / status_changed / resolved / updated (labels, assignee, team,
                                 priority, attributes, a private note)
    number.connected / disconnected   a connected number resumes enrollments paused for want of one

Rule events recorded: contact.created / tag_added / tag_removed / updated, lead.created,
lead.status_changed, deal.stage_changed, conversation.created / updated / opened / resolved, and
message.created (incoming and outgoing). Changes made by rules and follow-up steps never pass here.

May import: every context below it (rules, followups, platform, core) and contracts.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.contracts.platform_events import (
    CampaignRecipientReleased,
    ContactErased,
    ContactOptedIn,
    ContactOptedOut,
    ConversationCreated,
    ConversationOpened,
    ConversationResolved,
    ConversationStatus,
    ConversationStatusChanged,
    ConversationUpdated,
    DealStageChanged,
    HumanMessage,
    InboundMessage,
    LeadClosed,
    LeadCreated,
    LeadStatusChanged,
    MessageStatus,
    NumberConnected,
    NumberDisconnected,
    PlatformEvent,
)
from libs.common.core import outbox, validation
from libs.common.core.db import map_errors
from libs.common.core.errors import DatabaseUnavailable, InvalidInput, NotFound
from libs.common.followups import campaigns
from libs.common.followups import erasure as followups_erasure
from libs.common.followups.enrollments import resume_waiting_for_a_number
from libs.common.followups.stops import StopFlag, Stopped, count_stopped, stop_followups_for_contact
from libs.common.platform import contacts, conversations, leads, messages, numbers
from libs.common.platform.conversations import ConversationChange
from libs.common.platform.numbers import NumberStatus
from libs.common.platform.projects import require_project
from libs.common.platform.send_lane import StatusReport, report_status
from libs.common.rules import erasure as rules_erasure
from libs.common.rules.triggers import record_trigger

#: The tables this context owns: none (it calls each context's functions; ``tests/test_table_ownership.py``).
OWNS: frozenset[str] = frozenset()

log = logging.getLogger(__name__)


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
    #: Why the enrollments were stopped (the stop path's reason), when any were.
    stop_reason: str | None = None
    number_id: uuid.UUID | None = None
    #: Enrollments paused for want of a usable number that a connected number resumed.
    resumed_enrollment_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    #: The enrollment a released campaign recipient got.
    enrollment_id: uuid.UUID | None = None
    #: Triggers recorded for the rules that listen for this event.
    trigger_ids: list[int] = msgspec.field(default_factory=list)


def handle_event(
    pool: ConnectionPool,
    project_id: uuid.UUID,
    event: PlatformEvent,
    *,
    now: datetime,
    check_project: bool = False,
) -> EventResult:
    """Apply one event in a transaction of its own, then count what it stopped once that committed.

    ``check_project``: 404 for an unknown project (events over the broker carry no API key that proved it).

    Replies fail closed: a reply of a known contact that cannot be applied, for whatever reason but an
    unreachable database (then nothing can be written, and the event's retry comes back), still stops the
    contact's follow-ups (:func:`stop_after_unapplied_reply`) before the error goes on.
    """
    try:
        with map_errors(), pool.connection() as conn:
            if check_project:
                require_project(conn, project_id)
            result = apply_event(conn, project_id, event, now=now)
    except DatabaseUnavailable:
        raise  # the stop could not be written either: the client's (or the broker's) retry brings it
    except Exception as exc:
        if isinstance(event, InboundMessage):
            stop_after_unapplied_reply(pool, project_id, event, exc, now=now)
        raise
    count_stopped(Stopped(result.stop_reason, result.stopped_enrollment_ids))
    return result


def stop_after_unapplied_reply(
    pool: ConnectionPool, project_id: uuid.UUID, event: InboundMessage, error: Exception, *, now: datetime
) -> None:
    """Stop the follow-ups of a contact whose reply could not be applied, in a transaction of its own.

    The event's own transaction (the message, the stop, the triggers) was rolled back: without this, the
    reply is lost and the next step goes out to a contact who answered. Only the stop is kept; the error
    is still reported (the API answers it, the broker retries or dead-letters the event). Best effort: when
    this fails as well (the database is down), the event's retry stops them."""
    context = {
        "project_id": str(project_id),
        "contact_id": str(event.contact_id) if event.contact_id else None,
        "provider_message_id": event.provider_message_id,
        "reason": str(error) or type(error).__name__,
    }
    try:
        with map_errors(), pool.connection() as conn:
            contact_id = event.contact_id
            if contact_id is None and event.phone is not None:
                found = contacts.contact_by_phone(conn, project_id, validation.phone(event.phone))
                contact_id = found.id if found is not None else None
            if contact_id is None:
                log.warning("reply not applied, from an unknown contact", extra=context)
                return
            contacts.lock_contact(conn, project_id, contact_id)
            stopped = stop_followups_for_contact(conn, project_id, contact_id, "reply", now=now)
    except NotFound:  # another project's, or erased: no follow-ups of this project to stop
        log.warning("reply not applied, from an unknown contact", extra=context)
        return
    except Exception as stop_error:
        log.error(
            "reply not applied, and its follow-ups not stopped",
            extra=context | {"stop_error": str(stop_error)},
        )
        return
    count_stopped(stopped)
    log.warning(
        "reply not applied; the contact's follow-ups stopped",
        extra=context | {"contact_id": str(contact_id), "stopped": len(stopped.enrollment_ids)},
    )


def apply_event(
    conn: Connection[Any], project_id: uuid.UUID, event: PlatformEvent, *, now: datetime
) -> EventResult:
    """Apply one platform event in the caller's transaction."""
    kind = type(event).__struct_config__.tag
    assert isinstance(kind, str)
    event = _storable(event)
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


#: Messages are never refused for a NUL character (PostgreSQL text cannot hold one): a reply refused is a
#: reply lost, and a follow-up sent after it. The character is replaced, the same way every time (so a
#: repeated provider id still deduplicates).
_MESSAGE_EVENTS = (InboundMessage, HumanMessage)


def _storable(event: PlatformEvent) -> PlatformEvent:
    """The event as PostgreSQL can store it: a message's NUL characters replaced; any other event with one
    refused (422 naming the field) before anything is written."""
    if isinstance(event, _MESSAGE_EVENTS):
        changes = {
            name: value.replace("\x00", "\ufffd")
            for name in ("body", "provider_message_id")
            if isinstance(value := getattr(event, name), str) and "\x00" in value
        }
        return msgspec.structs.replace(event, **changes) if changes else event
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if isinstance(value, str | list | dict):
            validation.json_value(value, name)
    return event


def _stop(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    flag: StopFlag,
    now: datetime,
    result: EventResult,
    conversation_id: uuid.UUID | None = None,
) -> EventResult:
    """The stop path of ``flag``, in the event's transaction; its outcome goes on the result."""
    stopped = stop_followups_for_contact(
        conn, project_id, contact_id, flag, now=now, conversation_id=conversation_id
    )
    result.stopped_enrollment_ids = stopped.enrollment_ids
    result.cancelled_message_ids = stopped.cancelled_message_ids
    result.stop_reason = stopped.reason
    return result


def record(
    conn: Connection[Any],
    project_id: uuid.UUID,
    event: str,
    result: EventResult | None,
    now: datetime,
    *,
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID | None = None,
    **payload: Any,
) -> list[int]:
    """Record a trigger for ``event`` (when a rule listens); its id goes on the result (if one is given)."""
    trigger_id = record_trigger(
        conn,
        project_id,
        event,
        contact_id=contact_id,
        conversation_id=conversation_id,
        payload={key: value for key, value in payload.items() if value is not None},
        now=now,
    )
    found = [trigger_id] if trigger_id is not None else []
    if result is not None:
        result.trigger_ids += found
    return found


def _message(message_id: uuid.UUID, kind: str, content: str | None) -> dict[str, Any]:
    return {"id": str(message_id), "type": kind, "content": content}


# -- messages -----------------------------------------------------------------------------------------------


def _inbound(
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
    _stop(conn, project_id, contact_id, "reply", now, result)
    if new_contact:
        record(conn, project_id, "contact.created", result, now, contact_id=contact_id)
    message = _message(recorded.message_id, "incoming", event.body)
    record(
        conn,
        project_id,
        "message.created",
        result,
        now,
        contact_id=contact_id,
        conversation_id=conversation_id,
        message=message,
    )
    return result


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


def _human(conn: Connection[Any], project_id: uuid.UUID, event: HumanMessage, now: datetime) -> EventResult:
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
    _stop(conn, project_id, conversation.contact_id, "human_message", now, result, conversation.id)
    message = _message(recorded.message_id, "outgoing", event.body)
    record(
        conn,
        project_id,
        "message.created",
        result,
        now,
        contact_id=conversation.contact_id,
        conversation_id=conversation.id,
        message=message,
    )
    return result


def _status(conn: Connection[Any], project_id: uuid.UUID, event: MessageStatus, now: datetime) -> EventResult:
    report = StatusReport(
        status=event.status,
        message_id=event.message_id,
        provider_message_id=event.provider_message_id,
        error=event.error,
    )
    state, applied = report_status(conn, project_id, report, now=now)
    return EventResult(type="message.status", applied=applied, message_id=state.id, status=state.status)


# -- contacts -----------------------------------------------------------------------------------------------


def _opted_out(
    conn: Connection[Any], project_id: uuid.UUID, event: ContactOptedOut, now: datetime
) -> EventResult:
    contacts.lock_contact(conn, project_id, event.contact_id)
    changed = contacts.opt_out(conn, project_id, event.contact_id, now=now)
    result = EventResult(type="contact.opted_out", applied=changed, contact_id=event.contact_id)
    return _stop(conn, project_id, event.contact_id, "opt_out", now, result)


def _opted_in(
    conn: Connection[Any], project_id: uuid.UUID, event: ContactOptedIn, now: datetime
) -> EventResult:
    contacts.lock_contact(conn, project_id, event.contact_id)
    changed = contacts.opt_in(conn, project_id, event.contact_id, now=now)
    return EventResult(type="contact.opted_in", applied=changed, contact_id=event.contact_id)


def _erased(conn: Connection[Any], project_id: uuid.UUID, event: ContactErased, now: datetime) -> EventResult:
    """Privacy erasure: stop everything, then each context erases its part (nothing left that identifies
    the person)."""
    contacts.lock_contact_for_erasure(conn, project_id, event.contact_id)
    result = _stop(
        conn,
        project_id,
        event.contact_id,
        "any",
        now,
        EventResult(type="contact.erased", contact_id=event.contact_id),
    )
    followups_erasure.erase_contact(conn, project_id, event.contact_id, now=now)
    rules_erasure.erase_contact(conn, project_id, event.contact_id)
    outbox.erase_contact(conn, project_id, event.contact_id)
    contacts.erase_contact(conn, project_id, event.contact_id, now=now)
    return result


# -- leads and deals ----------------------------------------------------------------------------------------


def _lead_created(
    conn: Connection[Any], project_id: uuid.UUID, event: LeadCreated, now: datetime
) -> EventResult:
    contacts.lock_contact(conn, project_id, event.contact_id)
    lead_id = event.lead_id or uuid.uuid4()
    applied = leads.create_lead(conn, project_id, event.contact_id, lead_id, event.status, now=now)
    result = EventResult(
        type="lead.created",
        applied=applied,
        contact_id=event.contact_id,
        lead_id=lead_id,
        status=event.status,
    )
    if applied:
        record(
            conn,
            project_id,
            "lead.created",
            result,
            now,
            contact_id=event.contact_id,
            lead_id=str(lead_id),
            status=event.status,
        )
    return result


def _lead_status(
    conn: Connection[Any], project_id: uuid.UUID, event: LeadStatusChanged | LeadClosed, now: datetime
) -> EventResult:
    """A lead's new status; the lead-closed stop path runs when the lead goes from open to closed.

    A repeated event changes nothing (applied false) and stops nothing: follow-ups started after the lead
    closed are not stopped by a late duplicate of the close.
    """
    closed = isinstance(event, LeadClosed)
    contact_id = leads.lead_contact(conn, project_id, event.lead_id)
    contacts.lock_contact(conn, project_id, contact_id)
    change = leads.set_lead_status(conn, project_id, event.lead_id, event.status, closed=closed, now=now)
    result = EventResult(
        type="lead.closed" if closed else "lead.status_changed",
        applied=change.applied,
        contact_id=contact_id,
        lead_id=event.lead_id,
        status=event.status,
    )
    if change.applied and change.previous != event.status:
        record(
            conn,
            project_id,
            "lead.status_changed",
            result,
            now,
            contact_id=contact_id,
            lead_id=str(event.lead_id),
            status=event.status,
            changed={"lead.status": {"from": change.previous, "to": event.status}},
        )
    if change.closed_now:
        return _stop(conn, project_id, contact_id, "lead_closed", now, result)
    return result


def _deal_stage(
    conn: Connection[Any], project_id: uuid.UUID, event: DealStageChanged, now: datetime
) -> EventResult:
    contact_id, previous = leads.set_deal_stage(
        conn,
        project_id,
        event.deal_id,
        event.stage,
        contact_id=event.contact_id,
        lead_id=event.lead_id,
        now=now,
    )
    result = EventResult(
        type="deal.stage_changed", contact_id=contact_id, deal_id=event.deal_id, status=event.stage
    )
    if previous != event.stage:
        record(
            conn,
            project_id,
            "deal.stage_changed",
            result,
            now,
            contact_id=contact_id,
            deal_id=str(event.deal_id),
            stage=event.stage,
            lead_id=str(event.lead_id) if event.lead_id else None,
            changed={"deal.stage": {"from": previous, "to": event.stage}},
        )
    return result


# -- conversations ------------------------------------------------------------------------------------------


def _conversation_created(
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


def _conversation_status(
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
        return _stop(
            conn, project_id, conversation.contact_id, "conversation_resolved", now, result, conversation.id
        )
    return result


def _conversation_updated(
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
        record(
            conn,
            project_id,
            "conversation.updated",
            result,
            now,
            contact_id=conversation.contact_id,
            conversation_id=conversation.id,
            changed=changed,
        )
    return result


# -- campaigns ----------------------------------------------------------------------------------------------


def _recipient_released(
    conn: Connection[Any], project_id: uuid.UUID, event: CampaignRecipientReleased, now: datetime
) -> EventResult:
    """A campaign's released recipient enters its no-reply sequence; a refusal is the result's status."""
    contacts.lock_contact(conn, project_id, event.contact_id)
    enrollment, result = campaigns.release_recipient(
        conn, project_id, event.campaign_id, event.recipient_id, event.contact_id, now=now
    )
    return EventResult(
        type="campaign.recipient_released",
        applied=result == "enrolled",
        contact_id=event.contact_id,
        enrollment_id=enrollment.id if enrollment else None,
        status=result,
    )


# -- numbers ------------------------------------------------------------------------------------------------


def _number_status(
    conn: Connection[Any], project_id: uuid.UUID, event: NumberConnected | NumberDisconnected, now: datetime
) -> EventResult:
    """A number's new status; a connected number resumes the enrollments paused for want of one."""
    connected = isinstance(event, NumberConnected)
    kind = "number.connected" if connected else "number.disconnected"
    status: NumberStatus = "connected" if connected else "disconnected"
    number, previous = numbers.set_number_status(conn, project_id, event.number_id, status, now=now)
    result = EventResult(
        type=kind, applied=previous != number.status, number_id=number.id, status=number.status
    )
    if connected:
        result.resumed_enrollment_ids = resume_waiting_for_a_number(conn, project_id, now=now)
    return result


_HANDLERS: dict[type[Any], Callable[[Connection[Any], uuid.UUID, Any, datetime], EventResult]] = {
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
    ConversationUpdated: _conversation_updated,
    CampaignRecipientReleased: _recipient_released,
    NumberConnected: _number_status,
    NumberDisconnected: _number_status,
}
