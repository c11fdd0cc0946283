"""A follow-up step's outbound message: what it sends (a text, or an approved WhatsApp template with its
parameters rendered) and the message and ``followup.step_queued`` event that queue it, with the step's keys.

The release queues it (:mod:`~libs.common.followups.release_step`, which decides what a claimed step
sends); the provider's feedback queues a step again as its template
(:mod:`~libs.common.followups.provider_feedback`).
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import msgspec
from psycopg import Connection

from libs.common.contracts.events import StepQueued
from libs.common.core.ids import time_ordered_id
from libs.common.followups.definition import MessageStep, WhatsAppTemplate
from libs.common.followups.sequences import version_number
from libs.common.followups.templates import RenderContext, TemplateSkip, render
from libs.common.platform.messages import Activity, OutboundMessage


class StepContent(msgspec.Struct, frozen=True):
    """What a step sends: a free-form text, or an approved WhatsApp template with its parameters."""

    body: str | None
    template: WhatsAppTemplate | None = None
    parameters: list[str] | None = None


#: Why a step went out as its approved template (the step run's reason).
TEMPLATE_REASON: Final = "service_window_template"


def template_parameters(
    template: WhatsAppTemplate, context: RenderContext
) -> tuple[list[str] | None, TemplateSkip | None, str | None]:
    """A template's parameters rendered for ``context``, or None with the skip reason and its detail."""
    parameters = []
    for source in template.parameters:
        rendered = render(source, context)
        if rendered.text is None:
            return None, rendered.skip_reason, rendered.skip_detail
        parameters.append(rendered.text)
    return parameters, None, None


class StepOf(msgspec.Struct, frozen=True):
    """The enrollment's step a follow-up message is for."""

    project_id: uuid.UUID
    contact_id: uuid.UUID
    enrollment_id: uuid.UUID
    step_index: int
    sequence_id: uuid.UUID | None
    version_id: uuid.UUID
    campaign_id: uuid.UUID | None
    conversation_id: uuid.UUID | None


def step_message(
    conn: Connection[Any],
    of: StepOf,
    content: StepContent,
    number_id: uuid.UUID | None,
    reason: str | None,
    media: MessageStep | None,
) -> tuple[OutboundMessage, StepQueued]:
    """The step's message to queue (:func:`~libs.common.platform.messages.queue_contact_message`, or its
    writes in the caller's statement), and its ``followup.step_queued`` event (with ``reason``), for the
    caller to write with its own events."""
    message_id = time_ordered_id()  # the message table's key grows at its end (core.ids)
    # the step enters the contact's timeline (a followup_sent activity, the event's data) with its message
    event = StepQueued(
        enrollment_id=of.enrollment_id,
        sequence_id=of.sequence_id,
        contact_id=of.contact_id,
        step_index=of.step_index,
        message_id=message_id,
        reason=reason,
    )
    message = OutboundMessage(
        project_id=of.project_id,
        contact_id=of.contact_id,
        body=content.body,
        source="followup",
        media_url=media.media_url if media else None,
        media_kind=media.media_kind if media else None,
        number_id=number_id,
        conversation_id=of.conversation_id,
        followup_enrollment_id=of.enrollment_id,
        followup_step_index=of.step_index,
        sequence_id=of.sequence_id,
        sequence_version=(
            version_number(conn, of.project_id, of.version_id) if of.sequence_id is not None else None
        ),
        campaign_id=of.campaign_id,
        template_name=content.template.name if content.template else None,
        template_language=content.template.language if content.template else None,
        template_parameters=content.parameters,
        activity=Activity("followup_sent", event),
        id=message_id,
    )
    return message, event
