"""Platform events: what happens on the messaging platform that the engine must know about.

The same structs are taken by ``POST /v1/events`` and by the ``platform_event`` ingress actor; they are
applied by :func:`libs.common.ingress.apply_event`. A tagged union on ``type``.

Every text field is bounded (:mod:`libs.common.contracts.limits`): decoding refuses what is longer, on
either path, before anything is applied (422 naming the field over REST; dead-lettered over RabbitMQ).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec

from libs.common.contracts.limits import (
    MAX_ATTRIBUTES,
    MAX_LABEL_LENGTH,
    MAX_LABELS,
    NOT_BLANK_TEXT,
    ExternalId,
    Key,
    Label,
    Name,
    Note,
    Tag,
    Text,
    Url,
)

#: A conversation's status.
ConversationStatus = Literal["open", "pending", "snoozed", "resolved"]

#: What a send lane may report about an outbound message.
ReportedStatus = Literal["SENT", "DELIVERED", "READ", "FAILED"]

#: A phone number as the platform writes it (E.164, maybe with spaces, dashes or brackets).
Phone = Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
#: A conversation's labels.
Labels = Annotated[
    list[Annotated[Tag, msgspec.Meta(max_length=MAX_LABEL_LENGTH)]], msgspec.Meta(max_length=MAX_LABELS)
]
#: A conversation's custom attributes (a null value removes the key).
Attributes = Annotated[dict[Key, Any], msgspec.Meta(max_length=MAX_ATTRIBUTES)]


class _Event(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    pass


class InboundMessage(_Event, kw_only=True, tag="message.inbound"):
    """A message from a contact, by ``contact_id`` or by ``phone`` (a new phone creates the contact)."""

    provider_message_id: ExternalId
    contact_id: uuid.UUID | None = None
    phone: Phone | None = None
    conversation_id: uuid.UUID | None = None
    body: Text | None = None
    media_url: Url | None = None
    media_kind: Literal["image", "video", "audio", "document"] | None = None


class HumanMessage(_Event, kw_only=True, tag="message.human"):
    """An agent's message in a conversation (sent by the platform, not by the engine)."""

    conversation_id: uuid.UUID
    provider_message_id: ExternalId | None = None
    body: Text | None = None


class MessageStatus(_Event, kw_only=True, tag="message.status"):
    status: ReportedStatus
    message_id: uuid.UUID | None = None
    provider_message_id: ExternalId | None = None
    error: Text | None = None
    #: The provider's code of a failure (``131026``, ``63016``: docs/providers.md), kept as ``error_code``.
    error_code: ExternalId | None = None


class ContactOptedOut(_Event, kw_only=True, tag="contact.opted_out"):
    contact_id: uuid.UUID


class ContactOptedIn(_Event, kw_only=True, tag="contact.opted_in"):
    contact_id: uuid.UUID


class ContactErased(_Event, kw_only=True, tag="contact.erased"):
    contact_id: uuid.UUID


class LeadCreated(_Event, kw_only=True, tag="lead.created"):
    contact_id: uuid.UUID
    lead_id: uuid.UUID | None = None
    status: Label = "open"


class LeadStatusChanged(_Event, kw_only=True, tag="lead.status_changed"):
    lead_id: uuid.UUID
    status: Label


class LeadClosed(_Event, kw_only=True, tag="lead.closed"):
    lead_id: uuid.UUID
    status: Literal["won", "lost", "closed"] = "closed"


class DealStageChanged(_Event, kw_only=True, tag="deal.stage_changed"):
    deal_id: uuid.UUID
    stage: Label
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


class ConversationUpdated(_Event, kw_only=True, tag="conversation.updated"):
    """An agent (or the platform) changed a conversation's inbox fields; absent fields are kept.

    ``attributes`` are merged (a null value removes the key); ``private_note`` adds a note to the
    conversation. ``executed_by`` names an automation that made the change (``rule:<id>``): such a change
    fires no rule, so a platform that echoes the engine's own changes back cannot loop.
    """

    conversation_id: uuid.UUID
    labels: Labels | msgspec.UnsetType = msgspec.UNSET
    assignee: Name | msgspec.UnsetType | None = msgspec.UNSET
    team: Name | msgspec.UnsetType | None = msgspec.UNSET
    priority: Literal["low", "medium", "high", "urgent"] | msgspec.UnsetType | None = msgspec.UNSET
    attributes: Attributes | msgspec.UnsetType = msgspec.UNSET
    private_note: Annotated[Note, NOT_BLANK_TEXT] | None = None
    executed_by: Name | None = None


class CampaignRecipientReleased(_Event, kw_only=True, tag="campaign.recipient_released"):
    """A campaign released a recipient: enroll them in the campaign's no-reply sequence (once per
    campaign and recipient)."""

    campaign_id: uuid.UUID
    recipient_id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    contact_id: uuid.UUID


class NumberConnected(_Event, kw_only=True, tag="number.connected"):
    """A sending number is usable again: enrollments paused for want of one resume."""

    number_id: uuid.UUID


class NumberDisconnected(_Event, kw_only=True, tag="number.disconnected"):
    """A sending number can no longer send: follow-ups choose another, or wait for one."""

    number_id: uuid.UUID


#: A messaging limit tier of a business portfolio (WhatsApp's ``TIER_250`` ... ``TIER_UNLIMITED``).
MessagingTier = Literal["tier_250", "tier_1k", "tier_10k", "tier_100k", "tier_unlimited"]


class NumberQualityChanged(_Event, kw_only=True, tag="number.quality_changed"):
    """The provider rated a number again (WhatsApp's ``phone_number_quality_update``): its portfolio's
    messaging limit tier is now ``tier`` (a number in no portfolio: recorded, nothing changes)."""

    number_id: uuid.UUID
    tier: MessagingTier
    #: The provider's quality rating (``GREEN``, ``YELLOW``, ``RED``), for the record.
    quality: Annotated[str, msgspec.Meta(max_length=32)] | None = None


class PortfolioTierChanged(_Event, kw_only=True, tag="portfolio.tier_changed"):
    """A business portfolio's messaging limit tier changed."""

    portfolio_id: uuid.UUID
    tier: MessagingTier


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
    | ConversationUpdated
    | CampaignRecipientReleased
    | NumberConnected
    | NumberDisconnected
    | NumberQualityChanged
    | PortfolioTierChanged
)
