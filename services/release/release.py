"""One step, one transaction: the release path of seed 000.

    claim     the oldest due active enrollment whose lease is free, FOR UPDATE SKIP LOCKED
    contact   FOR SHARE SKIP LOCKED, and its project FOR KEY SHARE SKIP LOCKED (the inserted rows' foreign
              keys need it) (busy: retry in FOLLOWUP_BUSY_RETRY_SECONDS; never wait for a lock)
    checks    sequence paused -> pause; plan lost -> stop; opted out / erased -> stop; replied -> stop
    timing    rescheduled -> defer; reminder past grace -> skip; only_if not met -> skip
    sending   constraints (send window, consent, number, pacing, quotas, caps): see _sending_constraints
    render    missing vars.* / anchor.* -> skip
    queue     queue_contact_message -> followup_sent activity -> step run -> followup.step_queued -> advance

An unexpected error rolls the transaction back; the enrollment then backs off exponentially and is
failed after FOLLOWUP_MAX_FAILURES, so a poison row cannot hot-loop.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg import Connection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.clock import Clock
from libs.common.metrics import FOLLOWUP_FINISHED, FOLLOWUP_RELEASE_LAG, FOLLOWUP_STEPS
from libs.common.outbound import ConversationBusy, OutboundMessage, queue_contact_message
from libs.common.sequences import (
    AiStep,
    Definition,
    MessageStep,
    Step,
    TemplateFallback,
    step_due_at,
    version_definition,
)
from libs.common.settings import FollowupSettings
from libs.common.sql import load_queries
from libs.common.templates import RenderContext, render

log = logging.getLogger(__name__)

QUERIES = load_queries("services.release")


@dataclass(frozen=True)
class Released:
    """What one release transaction did: queue, skip, defer, pause, stop, busy, retry or fail."""

    enrollment_id: uuid.UUID
    action: str
    reason: str | None = None
    message_id: uuid.UUID | None = None


@dataclass(frozen=True)
class _Claim:
    """The claimed enrollment, its contact's state, and the step due."""

    row: dict[str, Any]
    contact: dict[str, Any]
    definition: Definition
    now: datetime

    @property
    def id(self) -> uuid.UUID:
        enrollment_id: uuid.UUID = self.row["id"]
        return enrollment_id

    @property
    def step(self) -> Step:
        index: int = self.row["step_index"]
        return self.definition.steps[index]


def release_one(pool: ConnectionPool, clock: Clock, settings: FollowupSettings) -> Released | None:
    """Release the oldest due enrollment, if any; returns what happened, or None when nothing is due."""
    now = clock.now()
    claimed_id: uuid.UUID | None = None
    try:
        # Pipeline mode: a statement whose result is read waits for it; the writes that follow the last
        # read travel together with the COMMIT in one round trip.
        with pool.connection() as conn, conn.pipeline():
            with conn.cursor(row_factory=dict_row) as cur:
                row = cur.execute(QUERIES["claim_due_enrollment"], {"now": now}).fetchone()
                if row is None:
                    return None
                claimed_id = row["id"]
                contact = cur.execute(QUERIES["lock_contact"], row | {"now": now}).fetchone()
            if contact is None:
                released = _defer(
                    conn, row["id"], now + timedelta(seconds=settings.busy_retry_seconds), "busy"
                )
            else:
                claim = _Claim(row, contact, version_definition(conn, row["version_id"]), now)
                released = _release(conn, claim, settings)
            conn.commit()
            return released
    except Exception as exc:
        if claimed_id is None:
            raise
        return _record_failure(pool, claimed_id, exc, now, settings)


def _release(conn: Connection[Any], claim: _Claim, settings: FollowupSettings) -> Released:
    checked = _checks(conn, claim)
    if checked is not None:
        return checked
    step = claim.step
    timing = _timing(conn, claim)
    if timing is not None:
        return timing
    constrained = _sending_constraints(conn, claim)
    if constrained is not None:
        return constrained
    text, reason = _render(claim, step)
    if text is None:
        assert reason is not None
        return _skip(conn, claim, reason)
    try:
        return _queue(conn, claim, step, text, reason)
    except ConversationBusy:
        return _defer(conn, claim.id, claim.now + timedelta(seconds=settings.busy_retry_seconds), "busy")


def _checks(conn: Connection[Any], claim: _Claim) -> Released | None:
    """Sequence paused -> pause; plan lost -> stop; opted out or erased -> stop; replied -> stop."""
    contact, row = claim.contact, claim.row
    if contact["sequence_status"] == "paused":
        conn.execute(QUERIES["pause"], {"id": claim.id, "reason": "sequence_paused", "now": claim.now})
        FOLLOWUP_STEPS.labels("pause", "sequence_paused").inc()
        return Released(claim.id, "pause", "sequence_paused")
    if not contact["plan_active"]:
        return _finish(conn, claim, "stopped", "plan_lost")
    if contact["erased"]:
        return _finish(conn, claim, "stopped", "contact_erased")
    if contact["opted_out"]:
        return _finish(conn, claim, "stopped", "opted_out")
    if row["stop_on_reply"] and contact["replied_at"] is not None:
        # the backstop: the reply's own stop path normally got here first
        return _finish(conn, claim, "stopped", "replied")
    return None


def _timing(conn: Connection[Any], claim: _Claim) -> Released | None:
    """Rescheduled -> defer; reminder past its grace -> skip; ``only_if`` not met -> skip."""
    step, row, now = claim.step, claim.row, claim.now
    if step.anchor_offset_seconds is not None:
        due = step_due_at(step, now=now, anchor_at=row["anchor_at"])
        if due is None:
            return _skip(conn, claim, "missing_anchor")
        if due > now:
            return _defer(conn, claim.id, due, "rescheduled")
        if now > due + timedelta(seconds=step.grace_seconds):
            return _skip(conn, claim, "past_due")
    contact = claim.contact
    for condition in step.only_if:
        met = {
            "no_reply_since_previous_step": not _replied_since(contact, row["last_step_at"]),
            "no_reply_since_enrollment": contact["replied_at"] is None,
            "previous_not_read": contact["last_message_status"] != "READ",
        }[condition]
        if not met:
            return _skip(conn, claim, f"only_if:{condition}")
    return None


def _replied_since(contact: dict[str, Any], moment: datetime | None) -> bool:
    """Whether the contact's last reply since enrollment came after ``moment`` (None: since enrollment)."""
    replied_at: datetime | None = contact["replied_at"]
    return replied_at is not None and (moment is None or replied_at > moment)


def _sending_constraints(conn: Connection[Any], claim: _Claim) -> Released | None:
    """The place for sending constraints: send window (defer to its opening), consent mode (skip),
    number choice (retry 15 s, pause after 30 min), pacing, follow-up window per number, monthly quota
    and backlog (defer), per-contact 24 h cap (defer). None of them is enforced yet: everything may send.
    """
    return None


def _render(claim: _Claim, step: Step) -> tuple[str | None, str | None]:
    """The text to send (or None) and the reason: the skip reason, or why a fallback was used."""
    if isinstance(step, MessageStep):
        template, fallback_reason = step.text, None
    else:
        assert isinstance(step, AiStep)
        # the model call comes with the AI steps work; until then every AI step takes its fallback
        if not isinstance(step.fallback, TemplateFallback):
            return None, "ai_unavailable"
        template, fallback_reason = step.fallback.text, "ai_fallback:model_unavailable"
    contact, row = claim.contact, claim.row
    rendered = render(
        template,
        RenderContext(
            variables=row["variables"],
            anchor_at=row["anchor_at"],
            timezone=contact["timezone"],
            fallback_timezone=contact["project_timezone"],
            contact_name=contact["name"],
            contact_phone=contact["phone"],
            contact_attributes=contact["attributes"],
        ),
    )
    if rendered.text is None:
        return None, rendered.skip_reason
    return rendered.text, fallback_reason


def _queue(conn: Connection[Any], claim: _Claim, step: Step, text: str, reason: str | None) -> Released:
    row, now = claim.row, claim.now
    queued = queue_contact_message(
        conn,
        OutboundMessage(
            project_id=row["project_id"],
            contact_id=row["contact_id"],
            body=text,
            source="followup",
            media_url=step.media_url if isinstance(step, MessageStep) else None,
            media_kind=step.media_kind if isinstance(step, MessageStep) else None,
            number_id=row["number_id"],
            conversation_id=row["conversation_id"],
            followup_enrollment_id=claim.id,
            followup_step_index=row["step_index"],
        ),
        now=now,
    )
    conn.execute(
        QUERIES["record_step_queued"],
        _step_params(claim, "queued", reason) | {"message_id": queued.message_id},
    )
    lag = max(0.0, (now - row["next_run_at"]).total_seconds())
    FOLLOWUP_RELEASE_LAG.observe(lag)
    FOLLOWUP_STEPS.labels("queue", _category(reason) if reason else "sent").inc()
    log.info(
        "step queued",
        extra={
            "project_id": str(row["project_id"]),
            "enrollment_id": str(claim.id),
            "step_index": row["step_index"],
            "message_id": str(queued.message_id),
            "lag_seconds": round(lag, 3),
        },
    )
    _advance(conn, claim, queued.message_id)
    return Released(claim.id, "queue", reason, queued.message_id)


def _skip(conn: Connection[Any], claim: _Claim, reason: str) -> Released:
    conn.execute(QUERIES["record_step_skipped"], _step_params(claim, "skipped", reason))
    FOLLOWUP_STEPS.labels("skip", _category(reason)).inc()
    log.info(
        "step skipped",
        extra={"enrollment_id": str(claim.id), "step_index": claim.row["step_index"], "reason": reason},
    )
    _advance(conn, claim, None)
    return Released(claim.id, "skip", reason)


def _step_params(claim: _Claim, outcome: str, reason: str | None) -> dict[str, Any]:
    row = claim.row
    return {
        "enrollment_id": claim.id,
        "project_id": row["project_id"],
        "contact_id": row["contact_id"],
        "sequence_id": row["sequence_id"],
        "step_index": row["step_index"],
        "outcome": outcome,
        "reason": reason,
        "due_at": row["next_run_at"],
        "now": claim.now,
        "data": Jsonb(
            {
                "enrollment_id": str(claim.id),
                "sequence_id": str(row["sequence_id"]) if row["sequence_id"] else None,
                "contact_id": str(row["contact_id"]),
                "step_index": row["step_index"],
                "reason": reason,
            }
        ),
    }


def _advance(conn: Connection[Any], claim: _Claim, message_id: uuid.UUID | None) -> None:
    """Schedule the next step from now, or complete the enrollment."""
    next_index = claim.row["step_index"] + 1
    params = {"id": claim.id, "message_id": message_id, "now": claim.now, "step_index": next_index}
    if next_index < len(claim.definition.steps):
        next_step = claim.definition.steps[next_index]
        due = step_due_at(next_step, now=claim.now, anchor_at=claim.row["anchor_at"]) or claim.now
        conn.execute(QUERIES["advance"], params | {"next_run_at": due})
    else:
        _finish(conn, claim, "completed", None, step_index=next_index, message_id=message_id)


def _finish(
    conn: Connection[Any],
    claim: _Claim,
    status: str,
    reason: str | None,
    *,
    step_index: int | None = None,
    message_id: uuid.UUID | None = None,
) -> Released:
    params = {"id": claim.id, "status": status, "reason": reason, "now": claim.now}
    conn.execute(QUERIES["finish"], params | {"step_index": step_index, "message_id": message_id})
    FOLLOWUP_FINISHED.labels(status, reason or "none").inc()
    if status != "completed":
        FOLLOWUP_STEPS.labels("stop", reason or "none").inc()
        log.info("enrollment stopped", extra={"enrollment_id": str(claim.id), "reason": reason})
    return Released(claim.id, "stop" if status == "stopped" else status, reason)


def _defer(conn: Connection[Any], enrollment_id: uuid.UUID, until: datetime, reason: str) -> Released:
    conn.execute(QUERIES["defer"], {"id": enrollment_id, "next_run_at": until})
    FOLLOWUP_STEPS.labels("defer", reason).inc()
    return Released(enrollment_id, "defer", reason)


def _category(reason: str) -> str:
    """A reason's bounded category for metric labels (``missing_variable:vars.x`` -> ``missing_variable``)."""
    return reason.split(":", 1)[0]


def backoff(failures: int, settings: FollowupSettings) -> timedelta:
    """Exponential backoff after the n-th consecutive failure: min, 2*min, ... capped at max."""
    seconds = settings.backoff_min_seconds * 2 ** max(0, failures - 1)
    return timedelta(seconds=min(seconds, settings.backoff_max_seconds))


def _record_failure(
    pool: ConnectionPool, enrollment_id: uuid.UUID, exc: Exception, now: datetime, settings: FollowupSettings
) -> Released:
    """The release transaction rolled back: count the failure, back off, or fail the enrollment."""
    error = f"{type(exc).__name__}: {exc}"[:1000]
    with pool.connection() as conn:
        row = conn.execute(QUERIES["count_failure"], {"id": enrollment_id, "error": error}).fetchone()
        if row is None:  # finished meanwhile (stopped, say): nothing left to retry
            return Released(enrollment_id, "retry", error)
        failures: int = row[0]
        if failures >= settings.max_failures:
            conn.execute(
                QUERIES["finish"],
                {
                    "id": enrollment_id,
                    "status": "failed",
                    "reason": "error",
                    "now": now,
                    "step_index": None,
                    "message_id": None,
                },
            )
            FOLLOWUP_FINISHED.labels("failed", "error").inc()
            action = "fail"
        else:
            conn.execute(
                QUERIES["defer"], {"id": enrollment_id, "next_run_at": now + backoff(failures, settings)}
            )
            action = "retry"
    FOLLOWUP_STEPS.labels(action, "error").inc()
    log.warning(
        "release failed",
        extra={"enrollment_id": str(enrollment_id), "failures": failures, "action": action, "error": error},
        exc_info=exc,
    )
    return Released(enrollment_id, action, error)


def release_batch(pool: ConnectionPool, clock: Clock, settings: FollowupSettings, limit: int = 100) -> int:
    """Release due enrollments one transaction at a time, up to ``limit``; returns how many were handled."""
    handled = 0
    while handled < limit:
        if release_one(pool, clock, settings) is None:
            break
        handled += 1
    return handled
