"""What every platform event shares once its handler made the platform change: the stop path (its outcome
on the result, counted after the commit), the sequences' goals and exits it meets and the rule triggers it
records (the triggers service nudged after the commit), the storable form of the event, the log line of
each event, and the fail-closed stop of a reply that could not be applied."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

import msgspec
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.contracts.platform_events import HumanMessage, InboundMessage, PlatformEvent
from libs.common.core import validation
from libs.common.core.db import map_errors
from libs.common.core.effects import Observe, after_commit
from libs.common.core.errors import NotFound
from libs.common.followups.goals import meet_goals
from libs.common.followups.stops import StopFlag, count_stopped, stop_followups_for_contact
from libs.common.followups.transitions import EnrollmentReason
from libs.common.platform import contacts
from libs.common.rules.triggers import record_trigger

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
    stop_reason: EnrollmentReason | None = None
    number_id: uuid.UUID | None = None
    #: Enrollments paused for want of a usable number that a connected number resumed.
    resumed_enrollment_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    #: What the engine did about a provider's failure (``message.status`` FAILED with an ``error_code``):
    #: a :data:`~libs.common.core.reasons.ProviderAction`, with its detail after a colon.
    provider_action: str | None = None
    #: The enrollment a released campaign recipient got.
    enrollment_id: uuid.UUID | None = None
    #: Live enrollments the event ended: a goal of their sequence met (converted), an exit met (exited).
    converted_enrollment_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    exited_enrollment_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    #: Finished enrollments the event converted late (a goal met inside their conversion window).
    converted_late_enrollment_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    #: Triggers recorded for the rules that listen for this event (public ids: random, they tell nothing of
    #: other projects' volume).
    trigger_ids: list[uuid.UUID] = msgspec.field(default_factory=list)


def stop(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    flag: StopFlag,
    now: datetime,
    result: EventResult,
    conversation_id: uuid.UUID | None = None,
) -> EventResult:
    """The stop path of ``flag``, in the event's transaction; its outcome goes on the result, and is counted
    once the transaction committed."""
    stopped = stop_followups_for_contact(
        conn, project_id, contact_id, flag, now=now, conversation_id=conversation_id
    )
    if stopped.enrollment_ids:
        after_commit(conn, Observe("stopped follow-ups", lambda: count_stopped(stopped)))
    result.stopped_enrollment_ids = stopped.enrollment_ids
    result.cancelled_message_ids += stopped.cancelled_message_ids
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
) -> list[uuid.UUID]:
    """Meet the goals and exits of the contact's sequences that ``event`` is about, and record a trigger for
    it (when a rule listens); what they did goes on the result (if one is given)."""
    payload = {key: value for key, value in payload.items() if value is not None}
    met = meet_goals(conn, project_id, event, contact_id, conversation_id, payload, now)
    trigger_id = record_trigger(
        conn,
        project_id,
        event,
        contact_id=contact_id,
        conversation_id=conversation_id,
        payload=payload,
        now=now,
    )
    if result is not None and met:
        result.converted_enrollment_ids += [m.id for m in met.converted]
        result.exited_enrollment_ids += [m.id for m in met.exited]
        result.converted_late_enrollment_ids += [m.id for m in met.converted_late]
        result.cancelled_message_ids += met.cancelled_message_ids
    found = [trigger_id] if trigger_id is not None else []
    if result is not None:
        result.trigger_ids += found
    return found


#: Messages are never refused for a NUL character (PostgreSQL text cannot hold one): a reply refused is a
#: reply lost, and a follow-up sent after it. The character is replaced, the same way every time (so a
#: repeated provider id still deduplicates).
_MESSAGE_EVENTS = (InboundMessage, HumanMessage)


def storable(event: PlatformEvent) -> PlatformEvent:
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


def log_applied(project_id: uuid.UUID, kind: str, result: EventResult) -> None:
    """The log line of an applied event."""
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
            "converted": len(result.converted_enrollment_ids) + len(result.converted_late_enrollment_ids),
            "exited": len(result.exited_enrollment_ids),
        },
    )


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
