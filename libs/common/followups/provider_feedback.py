"""The follow-ups' side of a provider's failure (the platform's side and the dispatch by class are
:mod:`libs.common.ingress.provider_feedback`'s): a follow-up message refused as outside the 24-hour service
window (131047, Twilio 470 and 63016) is retried once as its step's approved WhatsApp template, or its step
is skipped (``outside_service_window``).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.core.outbox import write_events
from libs.common.core.reasons import ProviderAction
from libs.common.core.sql import load_queries
from libs.common.followups.graph import sending_step
from libs.common.followups.sequences import version_definition
from libs.common.followups.step_messages import (
    TEMPLATE_REASON,
    StepContent,
    StepOf,
    step_message,
    template_parameters,
)
from libs.common.followups.templates import RenderContext
from libs.common.platform.messages import queue_contact_message

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.followups", "provider_feedback.sql")


class _FailedStep(msgspec.Struct, kw_only=True, frozen=True):
    enrollment_id: uuid.UUID
    step_index: int
    version_id: uuid.UUID
    sequence_id: uuid.UUID | None
    campaign_id: uuid.UUID | None
    variables: dict[str, Any]
    anchor_at: datetime | None
    was_template: bool
    number_id: uuid.UUID | None
    conversation_id: uuid.UUID | None
    contact_id: uuid.UUID
    name: str | None
    phone: str | None
    attributes: dict[str, Any]
    timezone: str | None
    project_timezone: str


def retry_as_template(
    conn: Connection[Any], project_id: uuid.UUID, message_id: uuid.UUID, *, now: datetime
) -> tuple[ProviderAction, str | None]:
    """The follow-up message went out free-form and the provider refused it as outside the service window:
    its step's approved template is queued in its place (once: a template refused so is only recorded), or
    the step is skipped when it has none (or a parameter cannot be filled in). Returns what was done and its
    detail (the new message's id, or the skip reason); ``recorded`` for a message no step run stands for (a
    rule's, or a retry's own failure)."""
    with conn.cursor(row_factory=class_row(_FailedStep)) as cur:
        failed = cur.execute(
            QUERIES["failed_step"], {"project_id": project_id, "message_id": message_id}
        ).fetchone()
    if failed is None or failed.was_template:
        return "recorded", None
    step = sending_step(version_definition(conn, project_id, failed.version_id), failed.step_index)
    keys = {"project_id": project_id, "enrollment_id": failed.enrollment_id, "step_index": failed.step_index}
    context = RenderContext(
        variables=failed.variables,
        anchor_at=failed.anchor_at,
        timezone=failed.timezone,
        fallback_timezone=failed.project_timezone,
        contact_name=failed.name,
        contact_phone=failed.phone,
        contact_attributes=failed.attributes,
    )
    template = step.whatsapp_template
    parameters = template_parameters(template, context)[0] if template is not None else None
    if template is None or parameters is None:
        skipped = keys | {
            "outcome": "skipped",
            "reason": "outside_service_window",
            "new_message_id": message_id,
        }
        conn.execute(QUERIES["rerun_step"], skipped)
        log.info("step skipped: outside the service window", extra={k: str(v) for k, v in keys.items()})
        return "step_skipped", "outside_service_window"
    of = StepOf(
        project_id,
        failed.contact_id,
        failed.enrollment_id,
        failed.step_index,
        failed.sequence_id,
        failed.version_id,
        failed.campaign_id,
        failed.conversation_id,
    )
    content = StepContent(None, template, parameters)
    message, event = step_message(conn, of, content, failed.number_id, TEMPLATE_REASON, None)
    queued = queue_contact_message(conn, message, now=now)
    retry_id = queued.message_id
    conn.execute(
        QUERIES["rerun_step"],
        keys | {"outcome": "queued", "reason": TEMPLATE_REASON, "new_message_id": retry_id},
    )
    write_events(conn, project_id, [queued.event, event], occurred_at=now)
    log.info(
        "step retried as its template",
        extra={k: str(v) for k, v in keys.items()}
        | {"message_id": str(retry_id), "failed_message_id": str(message_id)},
    )
    return "template_retry", str(retry_id)
