"""Stop paths: a reply, a human message, an opt-out, a closed lead, a resolved conversation or an erasure
stops the contact's live follow-ups inside the event's own transaction.

The caller has locked the contact (or, for inbox events, the conversation). Then ONE indexed
``UPDATE ... RETURNING`` over the contact's live enrollments whose copied stop flag matches stops them,
and the contact's follow-up messages still QUEUED for those enrollments are CANCELLED (with a
``message.failed`` event, reason CANCELLED). A message the send lane has already claimed (PROCESSING)
is left alone: the reply always wins until the send lane picks the message up.

The release path never waits for a lock (SKIP LOCKED on the contact and conversation), so the two
cannot deadlock: if the stop commits first, the release finds the enrollment stopped; if the release
commits first, the stop finds its message still QUEUED and cancels it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg import Connection

from libs.common.metrics import FOLLOWUP_FINISHED
from libs.common.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common", "stops.sql")

#: Which copied stop flag a stop path honours (``any``: every live enrollment, as erasure does).
StopFlag = Literal["reply", "human_message", "opt_out", "lead_closed", "conversation_resolved", "any"]

#: The reason recorded on the enrollment for each stop path.
REASONS: dict[StopFlag, str] = {
    "reply": "replied",
    "human_message": "human_message",
    "opt_out": "opted_out",
    "lead_closed": "lead_closed",
    "conversation_resolved": "conversation_resolved",
    "any": "contact_erased",
}


@dataclass(frozen=True)
class Stopped:
    """What a stop path did."""

    enrollment_ids: list[uuid.UUID]
    cancelled_message_ids: list[uuid.UUID]


def stop_followups_for_contact(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    flag: StopFlag,
    *,
    now: datetime,
    conversation_id: uuid.UUID | None = None,
) -> Stopped:
    """Stop the contact's live enrollments whose ``flag`` is set and cancel their QUEUED messages.

    With ``conversation_id`` (inbox events: a human reply, a resolved conversation) only enrollments
    tied to that conversation, or to no conversation, are stopped.
    """
    reason = REASONS[flag]
    params = {
        "project_id": project_id,
        "contact_id": contact_id,
        "flag": flag,
        "reason": reason,
        "conversation_id": conversation_id,
        "enrollment_id": None,
        "now": now,
    }
    stopped = [row[0] for row in conn.execute(QUERIES["stop_live_enrollments"], params).fetchall()]
    cancelled = [row[0] for row in conn.execute(QUERIES["cancel_queued_followups"], params).fetchall()]
    if stopped:
        FOLLOWUP_FINISHED.labels("stopped", reason).inc(len(stopped))
    if stopped or cancelled:
        log.info(
            "follow-ups stopped",
            extra={
                "project_id": str(project_id),
                "contact_id": str(contact_id),
                "reason": reason,
                "enrollment_ids": [str(i) for i in stopped],
                "cancelled_message_ids": [str(i) for i in cancelled],
            },
        )
    return Stopped(stopped, cancelled)


def cancel_queued_followups_of(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    reason: str,
    *,
    now: datetime,
) -> list[uuid.UUID]:
    """Cancel one enrollment's follow-up messages still QUEUED (stopped by hand, or replaced)."""
    params = {
        "project_id": project_id,
        "contact_id": contact_id,
        "flag": "any",
        "reason": reason,
        "conversation_id": None,
        "enrollment_id": enrollment_id,
        "now": now,
    }
    return [row[0] for row in conn.execute(QUERIES["cancel_queued_followups"], params).fetchall()]
