"""Ingress: one platform event, applied in one transaction: the platform change, then the stop paths, then
the triggers of the rules that listen for it (recorded only when the project has an active rule for the
event; see :mod:`libs.common.rules.triggers`). Contact changes made through the API go the same way
(:mod:`libs.common.ingress.contact_changes`).

Events arrive two ways that call the same function: ``POST /v1/events`` and the ``platform_event`` ingress
actor on RabbitMQ (both through :func:`handle_event`, which commits, then runs the after-commit effects the
change registered: the stops counted, the triggers service nudged, the release service nudged for an
enrollment due now).

One module per aggregate holds its handlers (:mod:`~libs.common.ingress.messages`, ``contacts``,
``conversations``, ``leads`` (leads and deals), ``numbers``, ``campaigns``); what they share (the stop
path, the triggers, the log line, the fail-closed reply) is :mod:`libs.common.ingress.apply`; the table
below, :data:`HANDLERS`, maps each event to its handler.

    message.inbound              a contact wrote (idempotent on provider_message_id): stops on reply
    message.human                an agent wrote in the inbox: stops on human message
    message.status               the send lane reports SENT / DELIVERED / READ / FAILED (monotonic)
    contact.opted_out / opted_in
    contact.erased               privacy erasure: every context erases its part
    lead.created / lead.status_changed / lead.closed;  deal.stage_changed
    conversation.created / opened / status_changed / resolved / updated (labels, assignee, team,
                                 priority, attributes, a private note)
    number.connected / disconnected   a connected number resumes enrollments paused for want of one
    number.quality_changed       the number's portfolio takes the tier the provider gave it
    portfolio.tier_changed       a portfolio's messaging limit tier

Rule events recorded: contact.created / tag_added / tag_removed / updated, lead.created,
lead.status_changed, deal.stage_changed, conversation.created / updated / opened / resolved, and
message.created (incoming and outgoing). Changes made by rules and follow-up steps never pass here.

May import: every context below it (rules, followups, platform, core) and contracts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.contracts.platform_events import (
    CampaignRecipientReleased,
    ContactErased,
    ContactOptedIn,
    ContactOptedOut,
    ConversationCreated,
    ConversationOpened,
    ConversationResolved,
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
    NumberQualityChanged,
    PlatformEvent,
    PortfolioTierChanged,
)
from libs.common.core import effects
from libs.common.core.db import map_errors
from libs.common.core.errors import DatabaseUnavailable
from libs.common.core.runtime import Runtime
from libs.common.ingress import campaigns, contacts, conversations, leads, messages, numbers
from libs.common.ingress.apply import EventResult, log_applied, record, stop_after_unapplied_reply, storable
from libs.common.platform.projects import require_project

__all__ = [
    "HANDLERS",
    "EventResult",
    "apply_event",
    "handle_event",
    "record",
    "stop_after_unapplied_reply",
]

#: The tables this context owns: none (it calls each context's functions; ``tests/test_table_ownership.py``).
OWNS: frozenset[str] = frozenset()

#: A handler: applies one event of its type in the caller's transaction.
Handler = Callable[[Connection[Any], uuid.UUID, Any, datetime], EventResult]

#: Which handler applies each platform event.
HANDLERS: dict[type[Any], Handler] = {
    InboundMessage: messages.inbound,
    HumanMessage: messages.human,
    MessageStatus: messages.status,
    ContactOptedOut: contacts.opted_out,
    ContactOptedIn: contacts.opted_in,
    ContactErased: contacts.erased,
    LeadCreated: leads.lead_created,
    LeadStatusChanged: leads.lead_status,
    LeadClosed: leads.lead_status,
    DealStageChanged: leads.deal_stage,
    ConversationCreated: conversations.created,
    ConversationOpened: conversations.status,
    ConversationStatusChanged: conversations.status,
    ConversationResolved: conversations.status,
    ConversationUpdated: conversations.updated,
    CampaignRecipientReleased: campaigns.recipient_released,
    NumberConnected: numbers.number_status,
    NumberDisconnected: numbers.number_status,
    NumberQualityChanged: numbers.quality_changed,
    PortfolioTierChanged: numbers.tier_changed,
}


def handle_event(
    runtime: Runtime,
    project_id: uuid.UUID,
    event: PlatformEvent,
    *,
    now: datetime,
    check_project: bool = False,
) -> EventResult:
    """Apply one event in a transaction of its own; once it committed, its after-commit effects run (what
    it stopped is counted, the services it gave work to are nudged).

    ``check_project``: 404 for an unknown project (events over the broker carry no API key that proved it).

    Replies fail closed: a reply of a known contact that cannot be applied, for whatever reason but an
    unreachable database (then nothing can be written, and the event's retry comes back), still stops the
    contact's follow-ups (:func:`stop_after_unapplied_reply`) before the error goes on.
    """
    try:
        with map_errors(), effects.transaction(runtime) as conn:
            if check_project:
                require_project(conn, project_id)
            return apply_event(conn, project_id, event, now=now)
    except DatabaseUnavailable:
        raise  # the stop could not be written either: the client's (or the broker's) retry brings it
    except Exception as exc:
        if isinstance(event, InboundMessage):
            stop_after_unapplied_reply(runtime.pool, project_id, event, exc, now=now)
        raise


def apply_event(
    conn: Connection[Any], project_id: uuid.UUID, event: PlatformEvent, *, now: datetime
) -> EventResult:
    """Apply one platform event in the caller's transaction."""
    kind = type(event).__struct_config__.tag
    assert isinstance(kind, str)
    event = storable(event)
    result = HANDLERS[type(event)](conn, project_id, event, now)
    log_applied(project_id, kind, result)
    return result
