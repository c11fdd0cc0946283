"""Messages: every message row the engine writes. Outbound messages go through the one shared send
function, :func:`queue_contact_message`; inbound (a contact's) and human (an agent's) messages are recorded
from platform events; a QUEUED message can be cancelled until the send lane claims it."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from libs.common.contracts.events import MessageFailed, MessageHuman, MessageQueued, MessageReceived
from libs.common.core.errors import Busy, InvalidInput, NotFound
from libs.common.core.ids import time_ordered_id
from libs.common.core.outbox import write_events
from libs.common.core.sql import OverIds, load_queries
from libs.common.platform.conversations import Conversation, create_conversation, get_conversation

QUERIES = load_queries("libs.common.platform", "messages.sql")
#: Cancelling a stopped contact's queued messages: most often one (:class:`~libs.common.core.sql.OverIds`).
CANCEL_QUEUED = OverIds.of(QUERIES["cancel_queued"])

#: Priority of follow-up messages in the send lane (lower is sooner).
FOLLOWUP_PRIORITY = 5
#: Rows the monthly message count of a project is spread over (concurrent releases rarely share one).
USAGE_SHARDS = 8


_encode = msgspec.json.Encoder().encode


class ConversationBusy(Busy):
    """The contact's open conversation is locked by another transaction: try again in a moment."""


class Activity(msgspec.Struct, frozen=True):
    """An entry of the contact's timeline that a queued message brings (a follow-up's ``followup_sent``):
    its kind and its data (anything msgspec encodes as a JSON object)."""

    kind: str
    data: Any


class OutboundMessage(msgspec.Struct, frozen=True):
    project_id: uuid.UUID
    contact_id: uuid.UUID
    #: The text (None for a template message).
    body: str | None
    source: str
    priority: int = FOLLOWUP_PRIORITY
    media_url: str | None = None
    media_kind: str | None = None
    number_id: uuid.UUID | None = None
    #: Thread into this conversation when it is still open (else the contact's newest open one).
    conversation_id: uuid.UUID | None = None
    followup_enrollment_id: uuid.UUID | None = None
    followup_step_index: int | None = None
    #: What sent it (shown by ``GET /v1/messages``): a follow-up's sequence (None for a one-off) and the
    #: number of its pinned version, and the campaign that released its enrollment; a rule and, for a
    #: delayed one, its execution.
    sequence_id: uuid.UUID | None = None
    sequence_version: int | None = None
    campaign_id: uuid.UUID | None = None
    rule_id: uuid.UUID | None = None
    rule_execution_id: uuid.UUID | None = None
    #: An approved WhatsApp template, sent instead of a text (outside the 24-hour service window).
    template_name: str | None = None
    template_language: str | None = None
    template_parameters: list[str] | None = None
    #: The sender's activity in the contact's timeline, written with the message in its one statement.
    activity: Activity | None = None
    #: The message's id, made here (a sender that names the message in its activity makes it first), so
    #: nothing waits for the insert's result: under a pipeline the writes that follow travel with it.
    #: Time-ordered (:mod:`~libs.common.core.ids`): the table's key grows at its end.
    id: uuid.UUID = msgspec.field(default_factory=time_ordered_id)


class LockedConversation(msgspec.Struct, frozen=True):
    """The open conversation a message threads into, already locked by the caller with the same choice as
    ``lock_open_conversation`` (the release step's state read locks it with the contact's state, saving
    the round trip)."""

    id: uuid.UUID
    number_id: uuid.UUID | None


class QueuedMessage(msgspec.Struct, frozen=True):
    message_id: uuid.UUID
    conversation_id: uuid.UUID
    #: The ``message.queued`` event; the caller writes it, with its own events in one statement.
    event: MessageQueued


def queue_contact_message(
    conn: Connection[Any],
    message: OutboundMessage,
    *,
    now: datetime,
    conversation: LockedConversation | None = None,
) -> QueuedMessage:
    """Queue a message for the send lane, in the caller's transaction.

    Threads it into ``conversation`` (the caller locked it), else the contact's open conversation (locked
    SKIP LOCKED: busy raises :class:`ConversationBusy`) or a new one; writes the message row (QUEUED), its
    status event, counts it in the project's monthly usage and, when the message brings one, writes its
    activity. The ``message.queued`` event is returned for the caller to write with its own events.
    """
    queued, params = message_to_queue(conn, message, now=now, conversation=conversation)
    conn.execute(INSERT_QUEUED_MESSAGE, params)
    return queued


#: The queued message's writes (:func:`queue_contact_message`), also a part of a caller's own statement
#: (:func:`~libs.common.core.sql.with_parts`: the release step writes them with its move).
INSERT_QUEUED_MESSAGE = QUERIES["insert_queued_message"]


def message_to_queue(
    conn: Connection[Any],
    message: OutboundMessage,
    *,
    now: datetime,
    conversation: LockedConversation | None = None,
) -> tuple[QueuedMessage, dict[str, Any]]:
    """:func:`queue_contact_message` but its writes: the conversation found (or made), then the queued
    message and the parameters of :data:`INSERT_QUEUED_MESSAGE`, for the caller to write in its own
    statement (the message's id, its conversation and ``now`` under the names the caller's statement may
    share: ``message_id``, ``conversation_id``, ``now``)."""
    params: dict[str, Any] = {
        "project_id": message.project_id,
        "contact_id": message.contact_id,
        "conversation_id": message.conversation_id,
        "now": now,
    }
    if conversation is not None:
        row: tuple[Any, ...] | None = (conversation.id, conversation.number_id)
    else:
        row = conn.execute(QUERIES["lock_open_conversation"], params).fetchone()
    if row is None:
        if conn.execute(QUERIES["open_conversation_exists"], params).fetchone():
            raise ConversationBusy()
        created, _ = create_conversation(
            conn, message.project_id, message.contact_id, now=now, number_id=message.number_id
        )
        row = (created.id, created.number_id)
    conversation_id: uuid.UUID = row[0]
    number_id: uuid.UUID | None = message.number_id or row[1]
    message_id = message.id
    activity = message.activity
    params |= {
        "message_id": message_id,
        "conversation_id": conversation_id,
        "number_id": number_id,
        "source": message.source,
        "priority": message.priority,
        "body": message.body,
        "media_url": message.media_url,
        "media_kind": message.media_kind,
        "followup_enrollment_id": message.followup_enrollment_id,
        "followup_step_index": message.followup_step_index,
        "sequence_id": message.sequence_id,
        "sequence_version": message.sequence_version,
        "campaign_id": message.campaign_id,
        "rule_id": message.rule_id,
        "rule_execution_id": message.rule_execution_id,
        "template_name": message.template_name,
        "template_language": message.template_language,
        "template_parameters": Jsonb(message.template_parameters)
        if message.template_parameters is not None
        else None,
        "month": now.astimezone(UTC).date().replace(day=1),
        "shard": random.randrange(USAGE_SHARDS),
        "activity_kind": activity.kind if activity is not None else None,
        "activity": _encode(activity.data).decode() if activity is not None else None,
    }
    event = MessageQueued(
        message_id=message_id,
        conversation_id=conversation_id,
        contact_id=message.contact_id,
        number_id=number_id,
        source=message.source,
        priority=message.priority,
        followup_enrollment_id=message.followup_enrollment_id,
    )
    return QueuedMessage(message_id, conversation_id, event), params


@dataclass(frozen=True)
class RecordedMessage:
    message_id: uuid.UUID
    conversation_id: uuid.UUID | None
    #: False when a message with the same provider id was recorded before (nothing was written).
    created: bool


def recorded_message(
    conn: Connection[Any], project_id: uuid.UUID, provider_message_id: str | None
) -> RecordedMessage | None:
    """The message already recorded under a provider message id, if any."""
    if provider_message_id is None:
        return None
    params = {"project_id": project_id, "provider_message_id": provider_message_id}
    row = conn.execute(QUERIES["message_by_provider_id"], params).fetchone()
    return RecordedMessage(row[0], row[1], created=False) if row is not None else None


def record_inbound_message(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID,
    *,
    provider_message_id: str,
    body: str | None,
    media_url: str | None,
    media_kind: str | None,
    now: datetime,
) -> RecordedMessage:
    """A contact's message (RECEIVED): the conversation now waits for an answer; ``message.received``."""
    params = {
        "project_id": project_id,
        "contact_id": contact_id,
        "conversation_id": conversation_id,
        "provider_message_id": provider_message_id,
        "body": body,
        "media_url": media_url,
        "media_kind": media_kind,
        "now": now,
    }
    return _record(conn, "insert_inbound_message", MessageReceived, params)


def record_human_message(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID,
    number_id: uuid.UUID | None,
    *,
    provider_message_id: str | None,
    body: str | None,
    now: datetime,
) -> RecordedMessage:
    """An agent's message (SENT, source human): the conversation no longer waits; ``message.human``."""
    params = {
        "project_id": project_id,
        "contact_id": contact_id,
        "conversation_id": conversation_id,
        "number_id": number_id,
        "provider_message_id": provider_message_id,
        "body": body,
        "now": now,
    }
    return _record(conn, "insert_human_message", MessageHuman, params)


def _record(
    conn: Connection[Any], query: str, event: type[MessageReceived | MessageHuman], params: dict[str, Any]
) -> RecordedMessage:
    """Insert a contact's or an agent's message and write its event."""
    row = conn.execute(QUERIES[query], params).fetchone()
    assert row is not None
    conversation_id: uuid.UUID = params["conversation_id"]
    recorded = event(message_id=row[0], contact_id=params["contact_id"], conversation_id=conversation_id)
    write_events(conn, params["project_id"], [recorded], occurred_at=params["now"])
    return RecordedMessage(row[0], conversation_id, created=True)


@dataclass(frozen=True)
class _Cancelled:
    id: uuid.UUID
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    followup_enrollment_id: uuid.UUID | None


def cancel_queued_messages(
    conn: Connection[Any],
    project_id: uuid.UUID,
    message_ids: list[uuid.UUID],
    stop_reason: str,
    *,
    now: datetime,
) -> list[uuid.UUID]:
    """CANCEL the given messages that are still QUEUED (claimed ones are the send lane's), each with a
    status event and a ``message.failed`` event (reason CANCELLED); returns the cancelled ids."""
    if not message_ids:
        return []
    params = {"project_id": project_id, "detail": stop_reason, "now": now}
    statement, params = CANCEL_QUEUED.bound(params, message_ids)
    with conn.cursor(row_factory=class_row(_Cancelled)) as cur:
        cancelled = cur.execute(statement, params).fetchall()
    events = [
        MessageFailed(
            message_id=m.id,
            reason="CANCELLED",
            stop_reason=stop_reason,
            contact_id=m.contact_id,
            conversation_id=m.conversation_id,
            followup_enrollment_id=m.followup_enrollment_id,
        )
        for m in cancelled
    ]
    write_events(conn, project_id, events, occurred_at=now)
    return [m.id for m in cancelled]


def recent_messages(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID | None,
    limit: int,
) -> list[dict[str, Any]]:
    """The contact's last ``limit`` messages with a text, newest first (only ``conversation_id``'s when
    given; cancelled ones left out): ``direction``, ``source``, ``body``, ``created_at`` each."""
    params = {"project_id": project_id, "contact_id": contact_id, "conversation_id": conversation_id}
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(QUERIES["recent_messages"], params | {"limit": limit}).fetchall()


#: Every status a message row may have (outbound: QUEUED to READ, FAILED, CANCELLED; inbound: RECEIVED).
MessageStatus = Literal[
    "QUEUED", "PROCESSING", "SENT", "DELIVERED", "READ", "FAILED", "CANCELLED", "RECEIVED"
]
#: Who wrote a message: the contact, an agent (human), a follow-up, a rule, a campaign, the API.
MessageSource = Literal["contact", "human", "followup", "rule", "campaign", "api"]
#: What sent a message: a sequence's step, a one-off follow-up, a rule, the contact, an agent, ...
OriginKind = Literal["sequence", "one_off", "rule", "contact", "human", "campaign", "api"]


class Origin(msgspec.Struct, kw_only=True, frozen=True):
    """What sent a message: ``kind``, and the ids that name it (null where they do not apply)."""

    kind: OriginKind
    enrollment_id: uuid.UUID | None = None
    sequence_id: uuid.UUID | None = None
    #: The number of the sequence's version the enrollment was pinned to.
    sequence_version: int | None = None
    #: The step of the follow-up (0-based).
    step_index: int | None = None
    rule_id: uuid.UUID | None = None
    #: The delayed execution that ran the rule (null when it ran on its trigger at once).
    rule_execution_id: uuid.UUID | None = None
    #: The campaign whose released recipient the follow-up is for (``PUT /v1/campaigns/{id}``).
    campaign_id: uuid.UUID | None = None


class StatusChange(msgspec.Struct, kw_only=True, frozen=True):
    """One status a message entered, with the send lane's detail (an error, a stop reason)."""

    status: MessageStatus
    detail: str | None
    #: What the engine did about a provider's failure (a :data:`~libs.common.core.reasons.ProviderAction`
    #: and its detail: ``marketing_deferred:<until>``, ``template_retry:<message id>``), else null.
    action: str | None = None
    occurred_at: datetime


class Message(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    number_id: uuid.UUID | None
    direction: Literal["inbound", "outbound"]
    status: MessageStatus
    source: MessageSource
    origin: Origin
    body: str | None
    media_url: str | None
    media_kind: str | None
    template_name: str | None
    template_language: str | None
    template_parameters: list[str] | None
    provider_message_id: str | None
    error: str | None
    #: The provider's code of a failure (docs/providers.md).
    error_code: str | None = None
    created_at: datetime
    status_changed_at: datetime


class MessageDetail(Message, kw_only=True, frozen=True):
    """A message with its status history, oldest first."""

    status_history: list[StatusChange]


class MessageFilters(msgspec.Struct, kw_only=True, frozen=True):
    """What a message list may be narrowed to (each optional; ``created_*`` bound ``created_at``)."""

    contact_id: uuid.UUID | None = None
    conversation_id: uuid.UUID | None = None
    enrollment_id: uuid.UUID | None = None
    rule_id: uuid.UUID | None = None
    sequence_id: uuid.UUID | None = None
    campaign_id: uuid.UUID | None = None
    source: MessageSource | None = None
    status: MessageStatus | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


_ORIGIN_OF_SOURCE: dict[str, OriginKind] = {
    "rule": "rule",
    "contact": "contact",
    "human": "human",
    "campaign": "campaign",
    "api": "api",
}


def _message(row: dict[str, Any]) -> dict[str, Any]:
    """A message row with its origin gathered from the columns that record it."""
    source = row["source"]
    if source == "followup":
        kind: OriginKind = "sequence" if row["sequence_id"] is not None else "one_off"
    else:
        kind = _ORIGIN_OF_SOURCE[source]
    row["origin"] = Origin(
        kind=kind,
        enrollment_id=row.pop("followup_enrollment_id"),
        sequence_id=row.pop("sequence_id"),
        sequence_version=row.pop("sequence_version"),
        step_index=row.pop("followup_step_index"),
        rule_id=row.pop("rule_id"),
        rule_execution_id=row.pop("rule_execution_id"),
        campaign_id=row.pop("campaign_id"),
    )
    return row


def list_messages(
    conn: Connection[Any],
    project_id: uuid.UUID,
    filters: MessageFilters,
    *,
    limit: int,
    after: uuid.UUID | None = None,
) -> list[Message]:
    """The project's messages, newest first, after the cursor ``after`` (a message id), narrowed by
    ``filters``."""
    if (
        filters.created_after is not None
        and filters.created_before is not None
        and filters.created_before <= filters.created_after
    ):
        raise InvalidInput("created_before must be later than created_after", field="created_before")
    for name in ("created_after", "created_before"):
        value = getattr(filters, name)
        if value is not None and value.tzinfo is None:
            raise InvalidInput(f"{name} needs a time zone offset (Z or +00:00)", field=name)
    return [msgspec.convert(_message(r), Message) for r in _rows(conn, project_id, filters, limit, after)]


def _rows(
    conn: Connection[Any],
    project_id: uuid.UUID,
    filters: MessageFilters,
    limit: int,
    after: uuid.UUID | None = None,
    message_id: uuid.UUID | None = None,
) -> list[dict[str, Any]]:
    params = msgspec.structs.asdict(filters)
    params |= {"project_id": project_id, "limit": limit, "after": after, "id": message_id}
    with conn.cursor(row_factory=dict_row) as cur:
        # unprepared: a generic plan cannot see which filters are NULL (as the send lane's claim)
        return cur.execute(QUERIES["list_messages"], params, prepare=False).fetchall()


def get_message(conn: Connection[Any], project_id: uuid.UUID, message_id: uuid.UUID) -> MessageDetail:
    """One message of the project with its status history (404 naming ``message_id`` otherwise)."""
    found = _rows(conn, project_id, MessageFilters(), 1, message_id=message_id)
    if not found:
        raise NotFound("message not found", field="message_id")
    params = {"project_id": project_id, "id": message_id}
    with conn.cursor(row_factory=dict_row) as cur:
        history = cur.execute(QUERIES["status_history"], params).fetchall()
    return msgspec.convert(_message(found[0]) | {"status_history": history}, MessageDetail)


#: Messages a conversation's read shows (the rest: ``GET /v1/messages?conversation_id=``).
CONVERSATION_MESSAGES = 20


class ConversationDetail(Conversation, kw_only=True, frozen=True):
    """A conversation with its last messages, newest first (at most :data:`CONVERSATION_MESSAGES`)."""

    last_messages: list[Message]


def get_conversation_detail(
    conn: Connection[Any], project_id: uuid.UUID, conversation_id: uuid.UUID
) -> ConversationDetail:
    """The conversation (404 naming ``conversation_id``) with its last messages."""
    conversation = get_conversation(conn, project_id, conversation_id)
    last = list_messages(
        conn, project_id, MessageFilters(conversation_id=conversation_id), limit=CONVERSATION_MESSAGES
    )
    return ConversationDetail(**msgspec.structs.asdict(conversation), last_messages=last)


def last_outbound_at(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID) -> datetime | None:
    """When the contact was last sent a message (by anything; a cancelled one never went), if ever."""
    row = conn.execute(
        QUERIES["last_outbound_at"], {"project_id": project_id, "contact_id": contact_id}
    ).fetchone()
    return row[0] if row is not None else None


def recent_outbound(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, since: datetime, limit: int
) -> list[datetime]:
    """When the engine's latest messages to the contact since ``since`` were queued (an agent's aside),
    newest first, at most ``limit``: what the contact's frequency caps count."""
    params = {"project_id": project_id, "contact_id": contact_id, "since": since, "limit": limit}
    return [row[0] for row in conn.execute(QUERIES["recent_outbound"], params).fetchall()]
