"""One step, one transaction: the release path of seed 000.

claim (FOR UPDATE SKIP LOCKED) -> contact (FOR SHARE SKIP LOCKED; busy: retry soon) -> checks ->
queue through the shared send function -> step run (PK enrollment x step) -> followup.step_queued ->
advance (next step scheduled from now, or completed). An unexpected error rolls the transaction back and
the enrollment backs off exponentially; after FOLLOWUP_MAX_FAILURES it is failed.
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
from libs.common.outbox import write_event
from libs.common.sequences import parse_definition
from libs.common.settings import FollowupSettings
from libs.common.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("services.release")


@dataclass(frozen=True)
class Released:
    """What one release transaction did."""

    enrollment_id: uuid.UUID
    action: str  # queued | stopped | busy | failed | retry
    reason: str | None = None
    message_id: uuid.UUID | None = None


def release_one(pool: ConnectionPool, clock: Clock, settings: FollowupSettings) -> Released | None:
    """Release the oldest due enrollment, if any; returns what happened, or None when nothing is due."""
    now = clock.now()
    claimed_id: uuid.UUID | None = None
    try:
        with pool.connection() as conn:
            with conn.cursor(row_factory=dict_row) as cur:
                enrollment = cur.execute(QUERIES["claim_due_enrollment"], {"now": now}).fetchone()
            if enrollment is None:
                return None
            claimed_id = enrollment["id"]
            return _release(conn, enrollment, now, settings)
    except Exception as exc:
        if claimed_id is None:
            raise
        return _record_failure(pool, claimed_id, exc, now, settings)


def _release(
    conn: Connection[Any], enrollment: dict[str, Any], now: datetime, settings: FollowupSettings
) -> Released:
    enrollment_id: uuid.UUID = enrollment["id"]
    contact = conn.execute(QUERIES["lock_contact"], {"contact_id": enrollment["contact_id"]}).fetchone()
    if contact is None:
        return _retry_soon(conn, enrollment_id, now, settings, "contact_busy")
    (opted_out,) = contact
    if opted_out:
        return _finish(conn, enrollment, now, status="stopped", reason="opted_out")

    # Sending constraints (send window, consent, number choice, pacing, quotas, caps) slot in here.

    definition = parse_definition(enrollment["definition"])
    step_index: int = enrollment["step_index"]
    step = definition.steps[step_index]
    try:
        queued = queue_contact_message(
            conn,
            OutboundMessage(
                project_id=enrollment["project_id"],
                contact_id=enrollment["contact_id"],
                body=step.text,
                source="followup",
                media_url=step.media_url,
                media_kind=step.media_kind,
                number_id=enrollment["number_id"],
                followup_enrollment_id=enrollment_id,
                followup_step_index=step_index,
            ),
            now=now,
        )
    except ConversationBusy:
        return _retry_soon(conn, enrollment_id, now, settings, "conversation_busy")
    conn.execute(
        QUERIES["insert_step_run"],
        {
            "enrollment_id": enrollment_id,
            "step_index": step_index,
            "project_id": enrollment["project_id"],
            "outcome": "queued",
            "reason": None,
            "message_id": queued.message_id,
            "due_at": enrollment["next_run_at"],
            "now": now,
        },
    )
    conn.execute(
        QUERIES["insert_activity"],
        {
            "project_id": enrollment["project_id"],
            "contact_id": enrollment["contact_id"],
            "kind": "followup_sent",
            "data": Jsonb({"enrollment_id": str(enrollment_id), "step_index": step_index}),
            "now": now,
        },
    )
    write_event(
        conn,
        project_id=enrollment["project_id"],
        type="followup.step_queued",
        aggregate_type="followup_enrollment",
        aggregate_id=enrollment_id,
        data={
            "enrollment_id": str(enrollment_id),
            "sequence_id": str(enrollment["sequence_id"]) if enrollment["sequence_id"] else None,
            "contact_id": str(enrollment["contact_id"]),
            "step_index": step_index,
            "message_id": str(queued.message_id),
        },
        occurred_at=now,
    )
    FOLLOWUP_STEPS.labels("message", "queued").inc()
    FOLLOWUP_RELEASE_LAG.observe(max(0.0, (now - enrollment["next_run_at"]).total_seconds()))
    log.info(
        "step queued",
        extra={
            "project_id": str(enrollment["project_id"]),
            "enrollment_id": str(enrollment_id),
            "step_index": step_index,
            "message_id": str(queued.message_id),
        },
    )
    next_index = step_index + 1
    if next_index < len(definition.steps):
        next_run_at = now + timedelta(seconds=definition.steps[next_index].delay_seconds)
        conn.execute(
            QUERIES["advance"],
            {
                "id": enrollment_id,
                "step_index": next_index,
                "next_run_at": next_run_at,
                "message_id": queued.message_id,
                "now": now,
            },
        )
    else:
        conn.execute(QUERIES["set_last_message"], {"id": enrollment_id, "message_id": queued.message_id})
        _finish(conn, enrollment, now, status="completed", reason=None)
    return Released(enrollment_id, "queued", message_id=queued.message_id)


def _finish(
    conn: Connection[Any], enrollment: dict[str, Any], now: datetime, *, status: str, reason: str | None
) -> Released:
    conn.execute(QUERIES["finish"], {"id": enrollment["id"], "status": status, "reason": reason, "now": now})
    if status == "completed":
        write_event(
            conn,
            project_id=enrollment["project_id"],
            type="followup.completed",
            aggregate_type="followup_enrollment",
            aggregate_id=enrollment["id"],
            data={"enrollment_id": str(enrollment["id"]), "contact_id": str(enrollment["contact_id"])},
            occurred_at=now,
        )
    FOLLOWUP_FINISHED.labels(status, reason or "none").inc()
    return Released(enrollment["id"], status, reason)


def _retry_soon(
    conn: Connection[Any], enrollment_id: uuid.UUID, now: datetime, settings: FollowupSettings, reason: str
) -> Released:
    retry_at = now + timedelta(seconds=settings.busy_retry_seconds)
    conn.execute(QUERIES["defer"], {"id": enrollment_id, "next_run_at": retry_at, "now": now})
    return Released(enrollment_id, "busy", reason)


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
                QUERIES["finish"], {"id": enrollment_id, "status": "failed", "reason": "error", "now": now}
            )
            FOLLOWUP_FINISHED.labels("failed", "error").inc()
            action = "failed"
        else:
            retry_at = now + backoff(failures, settings)
            conn.execute(QUERIES["defer"], {"id": enrollment_id, "next_run_at": retry_at, "now": now})
            action = "retry"
    FOLLOWUP_STEPS.labels("release", "error").inc()
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
