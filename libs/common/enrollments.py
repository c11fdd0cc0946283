"""Enrollments: ``enroll()``, the one way a contact enters a sequence (API, rules, bulk jobs, campaigns)."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

import msgspec
from psycopg import Connection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from libs.common.db import map_errors
from libs.common.errors import Conflict, InvalidInput, NotFound
from libs.common.metrics import FOLLOWUP_ENROLLMENTS
from libs.common.sequences import parse_definition
from libs.common.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common", "enrollments.sql")


class EnrollRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    sequence_id: uuid.UUID
    contact_id: uuid.UUID
    variables: dict[str, Any] = msgspec.field(default_factory=dict)
    anchor_at: datetime | None = None
    dedupe_key: str | None = None
    number_id: uuid.UUID | None = None


class Enrollment(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    version_id: uuid.UUID
    contact_id: uuid.UUID
    status: str
    source: str
    step_index: int
    next_run_at: datetime
    anchor_at: datetime | None
    variables: dict[str, Any]
    dedupe_key: str | None
    reason: str | None
    last_message_id: uuid.UUID | None
    enrolled_at: datetime
    finished_at: datetime | None


class AlreadyEnrolled(Conflict):
    """The contact already has a live enrollment in this sequence."""


class ContactOptedOut(Conflict):
    """The contact has opted out."""


_CONSTRAINTS = {"followup_enrollments_one_live_idx": lambda: AlreadyEnrolled(field="contact_id")}


def enroll(
    conn: Connection[Any],
    project_id: uuid.UUID,
    request: EnrollRequest,
    *,
    now: datetime,
    source: str = "api",
) -> Enrollment:
    """Enroll a contact in a sequence's current version; the first step is due after its delay."""
    try:
        enrollment = _enroll(conn, project_id, request, now=now, source=source)
    except Conflict as rejection:
        FOLLOWUP_ENROLLMENTS.labels(source, type(rejection).__name__).inc()
        raise
    FOLLOWUP_ENROLLMENTS.labels(source, "enrolled").inc()
    log.info(
        "enrolled",
        extra={"project_id": str(project_id), "enrollment_id": str(enrollment.id), "source": source},
    )
    return enrollment


def _enroll(
    conn: Connection[Any], project_id: uuid.UUID, request: EnrollRequest, *, now: datetime, source: str
) -> Enrollment:
    params: dict[str, Any] = {
        "project_id": project_id,
        "sequence_id": request.sequence_id,
        "contact_id": request.contact_id,
    }
    target = conn.execute(QUERIES["enrollment_target"], params).fetchone()
    if target is None:
        raise NotFound("sequence not found", field="sequence_id")
    status, version_id, definition, contact_found, opted_out = target
    if not contact_found:
        raise NotFound("contact not found", field="contact_id")
    if version_id is None or status in ("draft", "archived"):
        raise Conflict(f"the sequence is {status}: publish it before enrolling", field="sequence_id")
    if opted_out:
        raise ContactOptedOut(field="contact_id")
    if request.dedupe_key is not None and not 1 <= len(request.dedupe_key) <= 200:
        raise InvalidInput("dedupe_key must be 1 to 200 characters", field="dedupe_key")
    parsed = parse_definition(definition)
    first = parsed.steps[0]
    params |= {
        "version_id": version_id,
        "source": source,
        "next_run_at": now + timedelta(seconds=first.delay_seconds),
        "anchor_at": request.anchor_at,
        "variables": Jsonb(request.variables),
        "dedupe_key": request.dedupe_key,
        "number_id": request.number_id,
        "stop_on_reply": parsed.stop_on.reply,
        "stop_on_human_message": parsed.stop_on.human_message,
        "stop_on_opt_out": parsed.stop_on.opt_out,
        "stop_on_lead_closed": parsed.stop_on.lead_closed,
        "stop_on_conversation_resolved": parsed.stop_on.conversation_resolved,
        "now": now,
    }
    with map_errors(_CONSTRAINTS), conn.cursor(row_factory=class_row(Enrollment)) as cur:
        enrollment = cur.execute(QUERIES["insert_enrollment"], params).fetchone()
    assert enrollment is not None
    return enrollment


def get_enrollment(conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID) -> Enrollment:
    with conn.cursor(row_factory=class_row(Enrollment)) as cur:
        params = {"project_id": project_id, "id": enrollment_id}
        enrollment = cur.execute(QUERIES["get_enrollment"], params).fetchone()
    if enrollment is None:
        raise NotFound("enrollment not found", field="enrollment_id")
    return enrollment
