"""The action that sends the contact a message through the shared send path."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from psycopg import Connection

from libs.common.contracts.limits import MAX_MESSAGE_LENGTH, NOT_BLANK_TEXT, MessageText
from libs.common.core import validation
from libs.common.core.errors import InvalidInput
from libs.common.core.outbox import write_events
from libs.common.core.sql import load_queries
from libs.common.followups import project_settings
from libs.common.followups.constraints import (
    CAP_PERIOD,
    frequency_cap,
    outside_service_window,
    recipient_gap_end,
)
from libs.common.followups.definition import MessageCategory, WhatsAppTemplate, check_whatsapp_template
from libs.common.followups.send_window import zone
from libs.common.followups.templates import (
    TOO_LONG_REASON,
    RenderContext,
    Rendered,
    TemplateError,
    parse_template,
    render,
    render_message,
)
from libs.common.platform.messages import (
    OutboundMessage,
    last_outbound_at,
    queue_contact_message,
    recent_outbound,
)
from libs.common.rules.actions.base import ActionRejected, BaseAction, Done, Subject, form

QUERIES = load_queries("libs.common.rules", "actions.sql")


class RecipientGap(Exception):
    """The contact was sent a message less than ``min_recipient_gap_seconds`` ago: the trigger is retried
    (after its backoff), and the rule with it."""


class SendMessage(BaseAction, kw_only=True, tag="send_message"):
    """Send a text (a template over the contact's fields) through the shared send path (source ``rule``),
    obeying opt-out, consent, the WhatsApp service window (outside it: ``whatsapp_template`` if given) and
    the spacing of messages to one contact (within ``min_recipient_gap_seconds`` of the last one: retried).
    A text its values make longer than a message may be is not sent: the rule is refused
    (``message_too_long``)."""

    text: Annotated[MessageText, form("Message", widget="textarea"), NOT_BLANK_TEXT]
    whatsapp_template: Annotated[
        WhatsAppTemplate | None,
        form(
            "WhatsApp template",
            parts={
                "name": "WhatsApp template name (optional)",
                "language": "Template language",
                "parameters": ("Template parameters (one a line)", "textarea"),
            },
        ),
    ] = None
    #: What the message is for: a ``marketing`` one is refused past the contact's frequency caps
    #: (``contact_cap``, ``contact_day_cap``); ``utility`` and ``service`` pass.
    category: Annotated[MessageCategory, form("Category")] = "marketing"

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        validation.message_text(self.text, f"{where}.text")
        texts = {"text": self.text}
        if self.whatsapp_template is not None:
            texts |= check_whatsapp_template(self.whatsapp_template, f"{where}.whatsapp_template")
        for name, text in texts.items():
            if not text.strip():
                raise InvalidInput(f"{name} must not be empty", field=f"{where}.{name}")
            validation.text(text, f"{where}.{name}")
            try:
                parse_template(text)
            except TemplateError as exc:
                raise InvalidInput(str(exc), field=f"{where}.{name}") from None

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> None:
        row = conn.execute(
            QUERIES["message_recipient"], {"project_id": subject.project_id, "contact_id": subject.contact_id}
        ).fetchone()
        if row is None:
            raise ActionRejected("contact_erased")
        name, phone, attributes, timezone, project_timezone, opted_out, consent, erased, last_inbound_at = row
        if erased:
            raise ActionRejected("contact_erased")
        if opted_out:
            raise ActionRejected("opted_out", "the contact opted out")
        settings = project_settings.get_settings(conn, subject.project_id)
        if settings.consent_mode == "required" and consent != "granted":
            raise ActionRejected("no_consent", "consent is required and the contact has not granted it")
        spaced = recipient_gap_end(
            settings.min_recipient_gap_seconds, last_outbound_at(conn, subject.project_id, subject.contact_id)
        )
        if spaced is not None and spaced > now:
            raise RecipientGap(f"the contact may be sent its next message at {spaced.isoformat()}")
        _check_caps(conn, subject, settings, timezone, project_timezone, self.category, now)
        context = RenderContext(
            variables={"event_type": subject.type},
            anchor_at=None,
            timezone=timezone,
            fallback_timezone=project_timezone,
            contact_name=name,
            contact_phone=phone,
            contact_attributes=attributes,
        )
        outside = settings.service_window == "enforced" and outside_service_window(last_inbound_at, now)
        template = self.whatsapp_template
        if outside and template is None:
            raise ActionRejected("outside_service_window", "the contact has not written in 24 hours")
        body: str | None = None
        parameters: list[str] | None = None
        if outside and template is not None:
            parameters = [_parameter(p, context) for p in template.parameters]
        else:
            body = _body(self.text, context)
        # a busy conversation (ConversationBusy) is an error: the trigger is retried, and the rule with it
        queued = queue_contact_message(
            conn,
            OutboundMessage(
                project_id=subject.project_id,
                contact_id=subject.contact_id,
                body=body,
                source="rule",
                conversation_id=subject.conversation_id,
                rule_id=rule_id,
                rule_execution_id=subject.execution_id,
                template_name=template.name if outside and template else None,
                template_language=template.language if outside and template else None,
                template_parameters=parameters,
            ),
            now=now,
        )
        write_events(conn, subject.project_id, [queued.event], occurred_at=now)
        done.message_ids.append(queued.message_id)


def _check_caps(
    conn: Connection[Any],
    subject: Subject,
    settings: project_settings.ProjectSettings,
    timezone: str | None,
    project_timezone: str,
    category: MessageCategory,
    now: datetime,
) -> None:
    """A marketing message past the contact's frequency caps is refused (utility and service pass)."""
    caps = [c for c in (settings.max_per_contact_24h, settings.max_per_contact_day) if c is not None]
    if category != "marketing" or not caps:
        return
    recent = recent_outbound(
        conn, subject.project_id, subject.contact_id, since=now - CAP_PERIOD, limit=max(caps)
    )
    capped = frequency_cap(
        settings.max_per_contact_24h,
        settings.max_per_contact_day,
        recent,
        zone(timezone, project_timezone),
        now,
    )
    if capped is not None:
        raise ActionRejected(capped[0], f"the contact's cap is reached until {capped[1].isoformat()}")


def _body(text: str, context: RenderContext) -> str:
    """The message's text, as the release renders a step's (:func:`render_message`: the length limit)."""
    rendered = render_message(text, context)
    if rendered.skip_reason == TOO_LONG_REASON:
        raise ActionRejected(
            TOO_LONG_REASON, f"the message is longer than {MAX_MESSAGE_LENGTH} characters once filled in"
        )
    return _text_of(rendered)


def _parameter(template: str, context: RenderContext) -> str:
    """A WhatsApp template's parameter (as the release renders one: no length limit of a message)."""
    return _text_of(render(template, context))


def _text_of(rendered: Rendered) -> str:
    if rendered.text is None:
        assert rendered.skip_reason is not None  # no text: it says why
        lacks = rendered.skip_detail or "an anchor time"  # missing_variable names its placeholder
        raise ActionRejected(rendered.skip_reason, f"the message lacks {lacks}", detail=rendered.skip_detail)
    return rendered.text
