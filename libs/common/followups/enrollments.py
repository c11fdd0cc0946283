"""Enrollments: ``enroll()``, the one way a contact enters a sequence (API, rules, bulk jobs, campaigns),
and what can be done to an enrollment afterwards (read, list, pause, resume, stop, reschedule). The state
changes themselves are :mod:`libs.common.followups.transitions`."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Annotated, Any, Final, Literal, get_args

import msgspec
from psycopg import Connection
from psycopg.rows import class_row, kwargs_row
from psycopg.types.json import Jsonb

from libs.common.contracts.limits import DedupeKey, StopNote, Variables
from libs.common.core import validation
from libs.common.core.db import map_errors
from libs.common.core.effects import NudgeRelease, after_commit
from libs.common.core.errors import Conflict, InvalidInput, NotFound, Refusals
from libs.common.core.metrics import FOLLOWUP_ENROLLMENTS
from libs.common.core.reasons import Other, split
from libs.common.core.sql import load_queries
from libs.common.followups import transitions
from libs.common.followups.definition import Definition, Step, StopFlags, check_anchor, step_due_at
from libs.common.followups.release_step import StepOutcome, StepRunReason
from libs.common.followups.sequences import check_one_off, create_one_off_version, version_definition
from libs.common.followups.stops import Stopped
from libs.common.followups.stops import stop_enrollment as stop_live
from libs.common.followups.transitions import ENROLLMENT_ROW, Enrollment, EnrollmentStatus

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.followups", "enrollments.sql")

#: A moment in time with its offset (RFC 3339): a naive time would be read in the server's zone.
AwareDatetime = Annotated[datetime, msgspec.Meta(tz=True)]


class EnrollRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Enroll a contact in a sequence's current version, or in a one-off follow-up of its own ``steps``."""

    contact_id: uuid.UUID
    sequence_id: uuid.UUID | None = None
    steps: list[Step] | None = None
    stop_on: StopFlags | None = None
    variables: Variables = msgspec.field(default_factory=dict)
    anchor_at: AwareDatetime | None = None
    dedupe_key: DedupeKey | None = None
    number_id: uuid.UUID | None = None
    conversation_id: uuid.UUID | None = None


class EnrollmentUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Reschedule (a new ``anchor_at``) or change the template variables of a live enrollment."""

    anchor_at: AwareDatetime | msgspec.UnsetType | None = msgspec.UNSET
    variables: Variables | msgspec.UnsetType = msgspec.UNSET


class StopRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    note: StopNote | None = None


class StepRun(msgspec.Struct, kw_only=True, frozen=True):
    step_index: int
    outcome: StepOutcome
    #: Why the step was skipped, or queued otherwise than as written (a template, an AI step's fallback);
    #: ``other`` for a code this version does not know (its stored text is the detail).
    reason: Literal[StepRunReason, Other] | None
    #: What the reason is about: the ``only_if`` condition, the placeholder of ``missing_variable``, why
    #: an AI step fell back (``ai_fallback``); null for a reason that needs none.
    reason_detail: str | None
    message_id: uuid.UUID | None
    due_at: datetime
    ran_at: datetime


#: The step run reasons this version writes (a stored one it does not know reads as ``other``).
STEP_RUN_REASONS: Final[frozenset[StepRunReason]] = frozenset(get_args(StepRunReason))


def _step_run(*, reason: str | None, **columns: Any) -> StepRun:
    """A step run from its row, its stored ``code:detail`` reason split in two."""
    code, detail = split(reason, STEP_RUN_REASONS)
    return StepRun(reason=code, reason_detail=detail, **columns)


class EnrollmentMessage(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    step_index: int | None
    status: str
    body: str | None
    created_at: datetime


class EnrollmentDetail(msgspec.Struct, kw_only=True, frozen=True):
    enrollment: Enrollment
    step_runs: list[StepRun]
    messages: list[EnrollmentMessage]


#: Why ``enroll()`` refuses a contact (:class:`EnrollmentRejected`'s codes): the outcome a rule run, a bulk
#: job or a campaign records.
EnrollmentRejection = Literal[
    "rejected",
    "already_enrolled",
    "reentry_not_allowed",
    "opted_out",
    "plan_limit",
    "sequence_not_enrollable",
]


class EnrollmentRejected(Conflict):
    """The enrollment was rejected."""

    code: EnrollmentRejection = "rejected"


class AlreadyEnrolled(EnrollmentRejected):
    """The contact already has a live enrollment in this sequence."""

    code = "already_enrolled"


class ReentryNotAllowed(EnrollmentRejected):
    """The sequence's re-entry policy is never, and the contact was enrolled before."""

    code = "reentry_not_allowed"


class OptedOut(EnrollmentRejected):
    """The contact has opted out."""

    code = "opted_out"


class PlanLimitReached(EnrollmentRejected):
    """The project has reached its plan's maximum of active enrollments."""

    code = "plan_limit"


class SequenceNotEnrollable(EnrollmentRejected):
    """The sequence is not published or is archived."""

    code = "sequence_not_enrollable"


_CONSTRAINTS = {"followup_enrollments_one_live_idx": lambda: AlreadyEnrolled(field="contact_id")}


def enroll(
    conn: Connection[Any],
    project_id: uuid.UUID,
    request: EnrollRequest,
    *,
    now: datetime,
    source: str = "api",
    campaign_id: uuid.UUID | None = None,
) -> tuple[Enrollment, bool]:
    """Enroll a contact; returns the enrollment and whether it was created (``campaign_id``: the campaign
    that released it, named by each of its messages).

    A known ``dedupe_key`` returns the existing enrollment (created False). Business rejections are
    typed (:class:`EnrollmentRejected`) and counted in ``whatstig_followup_enrollments_total``.
    """
    try:
        enrollment, created = create_enrollment(
            conn, project_id, request, now=now, source=source, campaign_id=campaign_id
        )
    except EnrollmentRejected as rejection:
        FOLLOWUP_ENROLLMENTS.labels(source, rejection.code or "rejected").inc()
        raise
    FOLLOWUP_ENROLLMENTS.labels(source, "enrolled" if created else "deduplicated").inc()
    # a bulk job logs each chunk (with its job id): a line per contact of 100,000 would drown it
    log.log(
        logging.DEBUG if source == "bulk" else logging.INFO,
        "enrolled" if created else "enrollment deduplicated",
        extra={
            "project_id": str(project_id),
            "enrollment_id": str(enrollment.id),
            "contact_id": str(enrollment.contact_id),
            "sequence_id": str(enrollment.sequence_id) if enrollment.sequence_id else None,
            "source": source,
        },
    )
    if created:
        _nudge_if_due(conn, project_id, enrollment, now)
    return enrollment, created


def _by_dedupe_key(conn: Connection[Any], project_id: uuid.UUID, key: str) -> Enrollment | None:
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        return cur.execute(QUERIES["by_dedupe_key"], {"project_id": project_id, "dedupe_key": key}).fetchone()


def create_enrollment(
    conn: Connection[Any],
    project_id: uuid.UUID,
    request: EnrollRequest,
    *,
    now: datetime,
    source: str,
    campaign_id: uuid.UUID | None = None,
) -> tuple[Enrollment, bool]:
    """What :func:`enroll` does, without counting, logging or nudging: the enrollment and whether it was
    created (a sequence's preview enrolls so, in a savepoint it rolls back)."""
    existing = _deduplicated(conn, project_id, request)
    if existing is not None:
        return existing, False
    stop_on = _stop_flags(request)
    validation.keyed(request.variables, "variables")
    max_active, sequence = _check_contact(conn, project_id, request)
    definition, version_id = _pin_version(conn, project_id, request, sequence, stop_on, now)
    _check_plan_limit(conn, project_id, max_active)
    enrollment = _insert(
        conn, project_id, request, definition, version_id, source=source, campaign_id=campaign_id, now=now
    )
    if enrollment is None:  # a concurrent request with the same dedupe_key won
        assert request.dedupe_key is not None
        existing = _by_dedupe_key(conn, project_id, request.dedupe_key)
        assert existing is not None
        return existing, False
    return enrollment, True


def _deduplicated(conn: Connection[Any], project_id: uuid.UUID, request: EnrollRequest) -> Enrollment | None:
    """The enrollment already holding the request's ``dedupe_key``, if any."""
    if request.dedupe_key is None:
        return None
    if not 1 <= len(request.dedupe_key) <= 200:
        raise InvalidInput("dedupe_key must be 1 to 200 characters", field="dedupe_key")
    validation.text(request.dedupe_key, "dedupe_key")
    return _by_dedupe_key(conn, project_id, request.dedupe_key)


def check_request(request: EnrollRequest) -> None:
    """The checks of an enrollment request that need nothing stored, every error at once: a one-off's own
    steps as :func:`enroll` publishes them (with the stop flags it gives them), and the variables it
    stores (the API runs them on a body that did not decode too)."""
    refusals = Refusals()
    if request.steps is not None:
        with refusals.check():
            check_one_off(Definition(steps=request.steps, stop_on=request.stop_on or StopFlags()))
    with refusals.check():
        validation.keyed(request.variables, "variables")
    refusals.raise_any()


def _stop_flags(request: EnrollRequest) -> StopFlags:
    """A one-off follow-up's stop flags (a sequence brings its own)."""
    if (request.sequence_id is None) == (request.steps is None):
        raise InvalidInput("give either sequence_id or steps (a one-off follow-up)", field="sequence_id")
    if request.sequence_id is not None and request.stop_on is not None:
        raise InvalidInput("stop_on is set by the sequence; give it only with steps", field="stop_on")
    return request.stop_on or StopFlags()


def _check_contact(
    conn: Connection[Any], project_id: uuid.UUID, request: EnrollRequest
) -> tuple[int | None, tuple[bool, str | None, uuid.UUID | None]]:
    """The contact exists and has not opted out; the number and conversation are its project's and its
    own. Returns the project's plan limit (None: no limit) and the sequence as found (found, status,
    current version)."""
    params = {
        "project_id": project_id,
        "contact_id": request.contact_id,
        "number_id": request.number_id,
        "conversation_id": request.conversation_id,
        "sequence_id": request.sequence_id,
    }
    contact = conn.execute(QUERIES["enrollment_contact"], params).fetchone()
    if contact is None:
        raise NotFound("contact not found", field="contact_id")
    opted_out, number_found, conversation_found = contact[:3]
    max_active: int | None = contact[3]
    if request.number_id is not None and not number_found:
        raise NotFound("number not found", field="number_id")
    if request.conversation_id is not None and not conversation_found:
        raise NotFound("conversation not found for this contact", field="conversation_id")
    if opted_out:
        raise OptedOut(field="contact_id")
    return max_active, (contact[4], contact[5], contact[6])


def _pin_version(
    conn: Connection[Any],
    project_id: uuid.UUID,
    request: EnrollRequest,
    sequence: tuple[bool, str | None, uuid.UUID | None],
    stop_on: StopFlags,
    now: datetime,
) -> tuple[Definition, uuid.UUID]:
    """The version the enrollment pins: the sequence's current one (re-entry policy applied), or a
    one-off version of the request's own steps."""
    if request.sequence_id is not None:
        return _sequence_version(conn, project_id, request.sequence_id, sequence, request.contact_id, now)
    assert request.steps is not None
    version = create_one_off_version(conn, project_id, Definition(steps=request.steps, stop_on=stop_on))
    return version_definition(conn, project_id, version.id), version.id


def _check_plan_limit(conn: Connection[Any], project_id: uuid.UUID, max_active: int | None) -> None:
    """Serialise enrollments of a limited project, so its limit of live enrollments holds when concurrent."""
    if max_active is None:
        return
    live = conn.execute(QUERIES["lock_project_and_count_live"], {"project_id": project_id}).fetchone()
    if live is not None and live[0] >= max_active:
        raise PlanLimitReached(field="contact_id")


def _insert(
    conn: Connection[Any],
    project_id: uuid.UUID,
    request: EnrollRequest,
    definition: Definition,
    version_id: uuid.UUID,
    *,
    source: str,
    campaign_id: uuid.UUID | None,
    now: datetime,
) -> Enrollment | None:
    """The new enrollment, its stop flags copied from the version; None on a known dedupe key."""
    check_anchor(definition, request.anchor_at)
    flags = definition.stop_on
    params = {
        "project_id": project_id,
        "sequence_id": request.sequence_id,
        "version_id": version_id,
        "contact_id": request.contact_id,
        "conversation_id": request.conversation_id,
        "number_id": request.number_id,
        "source": source,
        "campaign_id": campaign_id,
        "next_run_at": step_due_at(definition.steps[0], now=now, anchor_at=request.anchor_at) or now,
        "anchor_at": request.anchor_at,
        "variables": Jsonb(request.variables),
        "dedupe_key": request.dedupe_key,
        "stop_on_reply": flags.reply,
        "stop_on_human_message": flags.human_message,
        "stop_on_opt_out": flags.opt_out,
        "stop_on_lead_closed": flags.lead_closed,
        "stop_on_conversation_resolved": flags.conversation_resolved,
        "now": now,
    }
    with map_errors(_CONSTRAINTS), conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        return cur.execute(QUERIES["insert_enrollment"], params).fetchone()


def _sequence_version(
    conn: Connection[Any],
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    sequence: tuple[bool, str | None, uuid.UUID | None],
    contact_id: uuid.UUID,
    now: datetime,
) -> tuple[Definition, uuid.UUID]:
    """The version to pin, after the sequence's re-entry policy has been applied."""
    found, status, version_id = sequence
    if not found:
        raise NotFound("sequence not found", field="sequence_id")
    if version_id is None or status == "archived":
        raise SequenceNotEnrollable(
            "the sequence is archived" if status == "archived" else "the sequence has no published version",
            field="sequence_id",
        )
    definition = version_definition(conn, project_id, version_id)
    params = {"project_id": project_id, "sequence_id": sequence_id, "contact_id": contact_id, "now": now}
    if definition.reentry == "never":
        if conn.execute(QUERIES["enrolled_before"], params).fetchone():
            raise ReentryNotAllowed(field="contact_id")
    elif definition.reentry == "always":
        conn.execute(QUERIES["serialise_reentry"], params)
        with conn.cursor(row_factory=class_row(_Live)) as cur:
            replaced = cur.execute(QUERIES["lock_live_in_sequence"], params).fetchall()
        for enrollment in replaced:  # counted once the re-entry committed with the enrollment replacing it
            stop_live(conn, project_id, enrollment, "reentered", now=now)
    return definition, version_id


class _Live(msgspec.Struct, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    contact_id: uuid.UUID


def get_enrollment(conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID) -> Enrollment:
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        params = {"project_id": project_id, "id": enrollment_id}
        enrollment = cur.execute(QUERIES["get_enrollment"], params).fetchone()
    if enrollment is None:
        raise NotFound("enrollment not found", field="enrollment_id")
    return enrollment


def get_enrollment_detail(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID
) -> EnrollmentDetail:
    """An enrollment with its step runs and its messages."""
    enrollment = get_enrollment(conn, project_id, enrollment_id)
    params = {"project_id": project_id, "id": enrollment_id}
    with conn.cursor(row_factory=kwargs_row(_step_run)) as cur:
        runs = cur.execute(QUERIES["step_runs"], params).fetchall()
    with conn.cursor(row_factory=class_row(EnrollmentMessage)) as cur:
        messages = cur.execute(QUERIES["enrollment_messages"], params).fetchall()
    return EnrollmentDetail(enrollment=enrollment, step_runs=runs, messages=messages)


def list_enrollments(
    conn: Connection[Any],
    project_id: uuid.UUID,
    *,
    limit: int,
    after: uuid.UUID | None = None,
    sequence_id: uuid.UUID | None = None,
    contact_id: uuid.UUID | None = None,
    status: EnrollmentStatus | None = None,
) -> list[Enrollment]:
    params = {
        "project_id": project_id,
        "limit": limit,
        "after": after,
        "sequence_id": sequence_id,
        "contact_id": contact_id,
        "status": status,
    }
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        return cur.execute(QUERIES["list_enrollments"], params).fetchall()


def _changed(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, changed: list[Enrollment]
) -> Enrollment:
    """The one enrollment a transition changed; 404 when it does not exist, 409 when it is not in a state
    the transition applies to."""
    if not changed:
        current = get_enrollment(conn, project_id, enrollment_id)  # 404 when it does not exist
        raise Conflict(f"the enrollment is {current.status}", field="enrollment_id")
    return changed[0]


def pause_enrollment(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, *, now: datetime
) -> Enrollment:
    paused = transitions.pause(conn, project_id, [enrollment_id], "manual", now=now)
    return _changed(conn, project_id, enrollment_id, paused)


def resume_enrollment(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, *, now: datetime
) -> Enrollment:
    """Reactivate a paused enrollment; a step that fell due while paused is due now."""
    resumed = transitions.resume(conn, project_id, [enrollment_id], now=now)
    enrollment = _changed(conn, project_id, enrollment_id, resumed)
    _nudge_if_due(conn, project_id, enrollment, now)
    return enrollment


def stop_enrollment(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, *, note: str | None, now: datetime
) -> tuple[Enrollment, Stopped]:
    """Stop a live enrollment by hand (reason ``manual``, with an optional note); the stop is counted once
    the transaction committed (:func:`libs.common.followups.stops.stop_enrollment` registers it)."""
    if note is not None and len(note) > 500:
        raise InvalidInput("note must be at most 500 characters", field="note")
    if note is not None:
        validation.text(note, "note")
    current = _lock_live(conn, project_id, enrollment_id)
    stopped = stop_live(conn, project_id, current, "manual", now=now, note=note)
    enrollment = msgspec.structs.replace(
        current,
        status="stopped",
        reason="manual",
        note=note if note is not None else current.note,
        finished_at=now,
        next_run_at=None,
    )
    return enrollment, stopped


def _lock_live(conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID) -> Enrollment:
    """Lock a live enrollment (a release holding it makes this wait); 404 or 409 when it is not live."""
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        current = cur.execute(
            QUERIES["lock_enrollment"], {"project_id": project_id, "id": enrollment_id}
        ).fetchone()
    if current is None:
        raise NotFound("enrollment not found", field="enrollment_id")
    if current.status not in ("active", "paused"):
        raise Conflict(f"the enrollment is {current.status}", field="enrollment_id")
    return current


def update_enrollment(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    data: EnrollmentUpdate,
    *,
    now: datetime,
) -> Enrollment:
    """Change variables or reschedule: a new ``anchor_at`` moves an anchor-timed pending step with it.

    The enrollment is locked first, so a release cannot advance it to another step between the read and
    the write (which would give the next step the due time computed for this one).
    """
    if not isinstance(data.variables, msgspec.UnsetType):
        validation.keyed(data.variables, "variables")
    current = _lock_live(conn, project_id, enrollment_id)
    anchor_at = current.anchor_at if isinstance(data.anchor_at, msgspec.UnsetType) else data.anchor_at
    next_run_at = current.next_run_at or now  # live: never None
    if not isinstance(data.anchor_at, msgspec.UnsetType):
        definition = version_definition(conn, project_id, current.version_id)
        check_anchor(definition, anchor_at)
        step = definition.steps[current.step_index]
        if step.anchor_offset_seconds is not None:
            next_run_at = step_due_at(step, now=now, anchor_at=anchor_at) or now
    variables = current.variables if isinstance(data.variables, msgspec.UnsetType) else data.variables
    updated = transitions.update_schedule(
        conn,
        project_id,
        enrollment_id,
        anchor_at=anchor_at,
        next_run_at=next_run_at,
        variables=variables,
        now=now,
    )
    assert updated is not None  # locked and live
    _nudge_if_due(conn, project_id, updated, now)
    return updated


def resume_waiting_for_a_number(
    conn: Connection[Any], project_id: uuid.UUID, *, now: datetime
) -> list[uuid.UUID]:
    """Resume the project's enrollments paused because no number was usable (``instance_unavailable``),
    and only those: a number connected, so the next poll releases them."""
    waiting = conn.execute(QUERIES["paused_for_a_number"], {"project_id": project_id}).fetchall()
    resumed = transitions.resume(conn, project_id, [row[0] for row in waiting], now=now)
    if resumed:
        log.info(
            "enrollments resumed: a number connected",
            extra={"project_id": str(project_id), "enrollment_ids": [str(e.id) for e in resumed]},
        )
    for enrollment in resumed:
        _nudge_if_due(conn, project_id, enrollment, now)
    return [e.id for e in resumed]


def _nudge_if_due(
    conn: Connection[Any], project_id: uuid.UUID, enrollment: Enrollment, now: datetime
) -> None:
    """An active enrollment due now: the release service is nudged once the change has committed."""
    due = enrollment.next_run_at
    if enrollment.status == "active" and due is not None and due <= now:
        after_commit(conn, NudgeRelease(project_id, enrollment.id))
