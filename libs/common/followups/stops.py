"""Stop paths: a reply, a human message, an opt-out, a closed lead, a resolved conversation or an erasure
stops the contact's live follow-ups inside the event's own transaction.

The caller has locked the contact (or, for inbox events, the conversation). Then one indexed scan on
``contact_id`` locks the live enrollments whose copied stop flag matches, they are finished as stopped
(:func:`libs.common.followups.transitions.finish`), and the contact's follow-up messages still QUEUED for
those enrollments are CANCELLED (with a ``message.failed`` event, reason CANCELLED). A message the send
lane has already claimed (PROCESSING) is left alone: the reply always wins until the send lane picks the
message up.

A reply to an enrollment waiting at a wait_for_reply step with a reply path does not stop it: it moves down
the reply path at once (:func:`_take_reply_paths`), its wait's step run ``branched`` ``replied``.

The release path never waits for a lock (SKIP LOCKED on the contact and conversation), so the two
cannot deadlock: if the stop commits first, the release finds the enrollment stopped; if the release
commits first, the stop finds its message still QUEUED and cancels it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from psycopg import Connection
from psycopg.rows import class_row

from libs.common.core.effects import Observe, after_commit
from libs.common.core.metrics import FOLLOWUP_FINISHED
from libs.common.core.sql import load_queries
from libs.common.followups.definition import step_due_at
from libs.common.followups.graph import END, reply_step
from libs.common.followups.sequences import version_definition
from libs.common.followups.transitions import EnrollmentReason, EnrollmentRef, finish, take_reply_path
from libs.common.platform.messages import cancel_queued_messages

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.followups", "stops.sql")

#: Which copied stop flag a stop path honours (``any``: every live enrollment, as erasure does).
#: ``undeliverable``: every live enrollment too, the provider having said the phone cannot receive.
StopFlag = Literal[
    "reply", "human_message", "opt_out", "lead_closed", "conversation_resolved", "undeliverable", "any"
]

#: The reason recorded on the enrollment for each stop path.
REASONS: dict[StopFlag, EnrollmentReason] = {
    "reply": "replied",
    "human_message": "human_message",
    "opt_out": "opted_out",
    "lead_closed": "lead_closed",
    "conversation_resolved": "conversation_resolved",
    "undeliverable": "undeliverable",
    "any": "contact_erased",
}


@dataclass(frozen=True)
class _Stoppable:
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    contact_id: uuid.UUID
    version_id: uuid.UUID
    anchor_at: datetime | None
    step_index: int
    #: Waiting for a reply with a reply path: where a reply moves it (-1: the end).
    reply_step: int | None


@dataclass(frozen=True)
class Stopped:
    """What a stop path did; :func:`count_stopped` counts it once the transaction committed."""

    reason: EnrollmentReason | None = None
    enrollment_ids: list[uuid.UUID] = field(default_factory=list)
    cancelled_message_ids: list[uuid.UUID] = field(default_factory=list)


def count_stopped(stopped: Stopped) -> None:
    """Count a committed stop in ``whatstig_followup_finished_total``."""
    if stopped.enrollment_ids:
        FOLLOWUP_FINISHED.labels("stopped", stopped.reason or "none").inc(len(stopped.enrollment_ids))


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
        "conversation_id": conversation_id,
        "enrollment_id": None,
    }
    with conn.cursor(row_factory=class_row(_Stoppable)) as cur:
        locked = cur.execute(QUERIES["lock_stoppable"], params).fetchall()
    continuing = [e for e in locked if flag == "reply" and e.reply_step is not None]
    stoppable = [e for e in locked if e not in continuing]
    _take_reply_paths(conn, project_id, continuing, now)
    finish(conn, project_id, stoppable, "stopped", reason, now=now)
    cancelled = _cancel_queued(conn, project_id, params, reason, now)
    if stoppable or cancelled:
        log.info(
            "follow-ups stopped",
            extra={
                "project_id": str(project_id),
                "contact_id": str(contact_id),
                "reason": reason,
                "enrollment_ids": [str(e.id) for e in stoppable],
                "cancelled_message_ids": [str(i) for i in cancelled],
            },
        )
    # a reason only when something was stopped or cancelled (a second reply stops nothing: no reason)
    return Stopped(reason if stoppable or cancelled else None, [e.id for e in stoppable], cancelled)


def _take_reply_paths(
    conn: Connection[Any], project_id: uuid.UUID, waiting: list[_Stoppable], now: datetime
) -> None:
    """Move enrollments that waited for this reply down their reply path (due as its first step says, from
    now), their wait's step run ``branched`` ``replied``; a reply path that ends completes them."""
    for enrollment in waiting:
        assert enrollment.reply_step is not None
        conn.execute(
            QUERIES["reply_step_run"],
            {
                "project_id": project_id,
                "enrollment_id": enrollment.id,
                "step_index": enrollment.step_index,
                "now": now,
            },
        )
        definition = version_definition(conn, project_id, enrollment.version_id)
        if enrollment.reply_step == END:
            finish(
                conn, project_id, [enrollment], "completed", None, now=now, step_index=len(definition.steps)
            )
            continue
        step = definition.steps[enrollment.reply_step]
        due = step_due_at(step, now=now, anchor_at=enrollment.anchor_at) or now
        then = reply_step(definition, enrollment.reply_step)  # the reply path may wait for a reply again
        take_reply_path(conn, project_id, enrollment.id, enrollment.reply_step, due, now=now, reply_step=then)
        log.info(
            "reply path taken",
            extra={
                "project_id": str(project_id),
                "enrollment_id": str(enrollment.id),
                "step_index": enrollment.step_index,
                "reply_step": enrollment.reply_step,
            },
        )


def stop_enrollment(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment: EnrollmentRef,
    reason: EnrollmentReason,
    *,
    now: datetime,
    note: str | None = None,
) -> Stopped:
    """Stop one live enrollment the caller locked (by hand, or replaced on re-entry) and cancel its
    follow-up message still QUEUED; counted once the transaction committed (an after-commit effect)."""
    finish(conn, project_id, [enrollment], "stopped", reason, now=now, note=note)
    params = {
        "project_id": project_id,
        "contact_id": enrollment.contact_id,
        "flag": "any",
        "conversation_id": None,
        "enrollment_id": enrollment.id,
    }
    cancelled = _cancel_queued(conn, project_id, params, reason, now)
    log.info("enrollment stopped", extra={"enrollment_id": str(enrollment.id), "reason": reason})
    stopped = Stopped(reason, [enrollment.id], cancelled)
    after_commit(conn, Observe("stopped enrollment", lambda: count_stopped(stopped)))
    return stopped


def cancel_queued_followups(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollments: Sequence[EnrollmentRef],
    reason: str,
    *,
    now: datetime,
) -> list[uuid.UUID]:
    """Cancel the follow-up messages still QUEUED of ``enrollments`` (finished by the caller, a goal or an
    exit met), as a stop path cancels them: ``reason`` is the cancellation's ``stop_reason``."""
    cancelled: list[uuid.UUID] = []
    for enrollment in enrollments:
        params = {
            "project_id": project_id,
            "contact_id": enrollment.contact_id,
            "flag": "any",
            "conversation_id": None,
            "enrollment_id": enrollment.id,
        }
        cancelled += _cancel_queued(conn, project_id, params, reason, now)
    return cancelled


def _cancel_queued(
    conn: Connection[Any], project_id: uuid.UUID, params: dict[str, Any], reason: str, now: datetime
) -> list[uuid.UUID]:
    queued = [row[0] for row in conn.execute(QUERIES["queued_followups"], params).fetchall()]
    return cancel_queued_messages(conn, project_id, queued, reason, now=now)
