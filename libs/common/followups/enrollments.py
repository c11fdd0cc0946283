"""Enrollments: ``enroll()``, the one way a contact enters a sequence (API, rules, bulk jobs, campaigns),
and what can be done to an enrollment afterwards (read, list, pause, resume, stop, reschedule). The state
changes themselves are :mod:`libs.common.followups.transitions`."""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Final, Literal, cast, get_args

import msgspec
from psycopg import Connection
from psycopg.rows import class_row, kwargs_row

from libs.common.contracts.limits import DedupeKey, StopNote, Variables
from libs.common.core import validation
from libs.common.core.db import buffered_pipeline
from libs.common.core.effects import NudgeRelease, after_commit
from libs.common.core.errors import Conflict, FollowupsError, InvalidInput, NotFound, Refusals
from libs.common.core.metrics import FOLLOWUP_ENROLLMENTS
from libs.common.core.reasons import Other, split
from libs.common.core.sql import load_queries
from libs.common.followups import transitions
from libs.common.followups.definition import (
    AiStep,
    Definition,
    MessageStep,
    Node,
    Step,
    StopFlags,
    check_anchor,
    step_due_at,
)
from libs.common.followups.goals import blocking_exits
from libs.common.followups.release_step import StepRunReason
from libs.common.followups.sequences import check_one_off, create_one_off_version, version_definition
from libs.common.followups.stops import Stopped
from libs.common.followups.stops import stop_enrollment as stop_live
from libs.common.followups.transitions import ENROLLMENT_ROW, Enrollment, EnrollmentStatus, StepOutcome

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.followups", "enrollments.sql")
#: ``insert_enrollments`` answering only what :class:`Enrolled` holds.
_INSERT_BRIEF = QUERIES["insert_enrollments"].replace(
    "SELECT * FROM enrolled", "SELECT id, contact_id, sequence_id, status, next_run_at FROM enrolled"
)
assert QUERIES["insert_enrollments"] != _INSERT_BRIEF

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
    #: A step held back (skipped): what its check compared (``{"consent": "pending", ...}``: docs/api.md
    #: lists them by reason); null when the reason kept none.
    reason_values: dict[str, Any] | None = None
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
    "exit_criteria",
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


class ExitCriteriaMet(EnrollmentRejected):
    """An exit criterion of the sequence that blocks entry holds for the contact."""

    code = "exit_criteria"

    def __init__(self, exit_name: str) -> None:
        super().__init__(f"the exit criterion {exit_name} holds for the contact", field="contact_id")
        #: The exit's name (a bulk job's skip reason carries it as its detail: ``exit_criteria:<name>``).
        self.detail = exit_name


class Enrolled(msgspec.Struct, frozen=True):
    """What :func:`enroll_all` answers for an enrollment it made when asked for ``brief`` results (a bulk
    chunk): not the whole row, 500 of which cost a chunk more than its insert."""

    id: uuid.UUID
    contact_id: uuid.UUID
    sequence_id: uuid.UUID | None
    status: EnrollmentStatus
    next_run_at: datetime | None


#: What :func:`enroll_all` gives for each request: the enrollment and whether it was created, or why not (a
#: refusal, or an error of the request's own data: a due time beyond the calendar).
EnrollResult = tuple[Enrollment | Enrolled, bool] | FollowupsError | OverflowError | ValueError


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
    [result] = enroll_all(conn, project_id, [request], now=now, source=source, campaign_id=campaign_id)
    return _whole(result)


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
    [result] = _enroll_batch(
        conn, project_id, [request], now=now, source=source, campaign_id=campaign_id, brief=False
    )
    return _whole(result)


def _whole(result: EnrollResult) -> tuple[Enrollment, bool]:
    """A result asked for whole (not ``brief``): the enrollment and whether it was created, or its refusal
    raised."""
    if isinstance(result, Exception):
        raise result
    enrollment, created = result
    assert isinstance(enrollment, Enrollment)
    return enrollment, created


def enroll_all(
    conn: Connection[Any],
    project_id: uuid.UUID,
    requests: Sequence[EnrollRequest],
    *,
    now: datetime,
    source: str = "api",
    campaign_id: uuid.UUID | None = None,
    brief: bool = False,
) -> list[EnrollResult]:
    """Enroll contacts in one sequence (or one contact in a one-off of its own steps): each request's
    result, in order, as if each had gone through :func:`enroll` in turn (a refusal changes nothing), in a
    few statements for them all. :func:`enroll` is the case of one request.

    The requests go in batches of distinct contacts (a contact listed again starts the next batch, which
    sees what the one before did). A batch: the contacts, the plan limit with the project's live count and
    the sequence read in one round trip (a project with a plan limit locked first, until the transaction
    ends: its enrollments go one transaction at a time, so the limit holds when they are concurrent); every
    rule applied to each contact in order, in the order :func:`enroll` applies them (the
    contact, its opt-out, the sequence, the re-entry policy, the plan limit with what the contacts before it
    took, the anchor, the live enrollment); the live enrollments re-entry replaces stopped; the admitted
    contacts inserted in one statement. Each result is counted in ``whatstig_followup_enrollments_total``
    and each enrollment logged; one due now nudges the release service once committed. ``brief``: an
    enrollment made is answered as :class:`Enrolled` (its keys, status and due time), not whole.
    """
    if len({r.sequence_id for r in requests}) > 1 or (len(requests) > 1 and requests[0].steps is not None):
        raise ValueError("enroll_all enrolls in one sequence, or one contact in a one-off")
    results: list[EnrollResult] = []
    batch: list[EnrollRequest] = []
    seen: set[uuid.UUID | str] = set()
    for request in requests:
        if request.contact_id in seen or request.dedupe_key in seen:
            results += _enroll_batch(
                conn, project_id, batch, now=now, source=source, campaign_id=campaign_id, brief=brief
            )
            batch, seen = [], set()
        batch.append(request)
        seen.add(request.contact_id)
        if request.dedupe_key is not None:
            seen.add(request.dedupe_key)
    if batch:
        results += _enroll_batch(
            conn, project_id, batch, now=now, source=source, campaign_id=campaign_id, brief=brief
        )
    _observe(conn, project_id, results, now=now, source=source)
    return results


def _observe(
    conn: Connection[Any], project_id: uuid.UUID, results: list[EnrollResult], *, now: datetime, source: str
) -> None:
    """Count each result, log each enrollment, and nudge the release service for those due now."""
    # a bulk job logs each chunk (with its job id): a line per contact of 100,000 would drown it
    level = logging.DEBUG if source == "bulk" else logging.INFO
    logged = log.isEnabledFor(level)
    counted: Counter[str] = Counter()
    for result in results:
        if isinstance(result, EnrollmentRejected):
            counted[result.code or "rejected"] += 1
        if not isinstance(result, tuple):
            continue
        enrollment, created = result
        counted["enrolled" if created else "deduplicated"] += 1
        if logged:
            log.log(
                level,
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
    for outcome, count in counted.items():
        FOLLOWUP_ENROLLMENTS.labels(source, outcome).inc(count)


def _by_dedupe_key(conn: Connection[Any], project_id: uuid.UUID, key: str) -> Enrollment | None:
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        return cur.execute(QUERIES["by_dedupe_key"], {"project_id": project_id, "dedupe_key": key}).fetchone()


class _Contact(msgspec.Struct, frozen=True):
    """A request's contact as :data:`enrollment_contact` read it, with the project's and sequence's facts."""

    n: int
    found: bool
    opted_out: bool
    number_found: bool
    conversation_found: bool
    enrolled_before: bool
    live: bool
    max_active_enrollments: int | None
    live_enrollments: int | None
    sequence_found: bool
    sequence_status: str | None
    current_version_id: uuid.UUID | None


def _enroll_batch(
    conn: Connection[Any],
    project_id: uuid.UUID,
    requests: list[EnrollRequest],
    *,
    now: datetime,
    source: str,
    campaign_id: uuid.UUID | None,
    brief: bool,
) -> list[EnrollResult]:
    """A batch of requests of distinct contacts (and dedupe keys): see :func:`enroll_all`."""
    results: list[EnrollResult | None] = [None] * len(requests)
    pending: list[int] = []
    for i, request in enumerate(requests):  # what needs nothing stored, and a known dedupe key
        try:
            existing = _deduplicated(conn, project_id, request)
            if existing is not None:
                results[i] = (existing, False)
                continue
            _stop_flags(request)
            validation.keyed(request.variables, "variables")
        except FollowupsError as refusal:
            results[i] = refusal
            continue
        pending.append(i)
    if pending:
        _enroll_checked(
            conn,
            project_id,
            requests,
            pending,
            results,
            now=now,
            source=source,
            campaign_id=campaign_id,
            brief=brief,
        )
    assert all(result is not None for result in results)
    return cast(list[EnrollResult], results)


def _enroll_checked(
    conn: Connection[Any],
    project_id: uuid.UUID,
    requests: list[EnrollRequest],
    pending: list[int],
    results: list[EnrollResult | None],
    *,
    now: datetime,
    source: str,
    campaign_id: uuid.UUID | None,
    brief: bool,
) -> None:
    """The batch's requests at ``pending``, each checked against what is stored, then the admitted ones
    enrolled; ``results`` filled in at their positions."""
    contacts = _contacts(conn, project_id, [requests[i] for i in pending])
    admitted = []
    for i, contact in zip(pending, contacts, strict=True):
        refusal = _contact_refusal(requests[i], contact)
        if refusal is not None:
            results[i] = refusal
        else:
            admitted.append(i)
    if not admitted:
        return
    first = requests[admitted[0]]
    try:
        definition, version_id = _pin_version(conn, project_id, first, contacts[0], _stop_flags(first))
    except FollowupsError as refusal:  # the sequence's refusal, the same for every contact
        for i in admitted:
            results[i] = refusal
        return
    facts = dict(zip(pending, contacts, strict=True))
    if definition.reentry == "never":
        for i in admitted:
            if facts[i].enrolled_before:
                results[i] = ReentryNotAllowed(field="contact_id")
        admitted = [i for i in admitted if results[i] is None]
    blocked = blocking_exits(conn, project_id, definition, [requests[i].contact_id for i in admitted])
    for i in admitted:
        if requests[i].contact_id in blocked:
            results[i] = ExitCriteriaMet(blocked[requests[i].contact_id])
    admitted = [i for i in admitted if results[i] is None]
    replaced = _replaced(conn, project_id, first.sequence_id, [requests[i] for i in admitted], definition)
    max_active, live_now = contacts[0].max_active_enrollments, contacts[0].live_enrollments
    room = max_active - live_now if max_active is not None and live_now is not None else None
    to_insert: list[tuple[int, datetime]] = []
    for i in admitted:
        request = requests[i]
        replacing = replaced.get(request.contact_id, [])
        if room is not None and room + len(replacing) < 1:
            results[i] = PlanLimitReached(field="contact_id")
            continue
        try:
            check_anchor(definition, request.anchor_at)
            next_run_at = step_due_at(definition.steps[0], now=now, anchor_at=request.anchor_at) or now
        except (FollowupsError, OverflowError, ValueError) as error:
            results[i] = error
            continue
        if facts[i].live and definition.reentry == "after_finished":
            results[i] = AlreadyEnrolled(field="contact_id")
            continue
        if room is not None:
            room += len(replacing) - 1
        to_insert.append((i, next_run_at))
    for i, _ in to_insert:  # counted once the re-entry committed with the enrollment replacing it
        for live in replaced.get(requests[i].contact_id, []):
            stop_live(conn, project_id, live, "reentered", now=now)
    inserted = _insert(
        conn, project_id, requests, to_insert, definition, version_id, source, campaign_id, now, brief
    )
    for i, _ in to_insert:
        request = requests[i]
        enrollment = inserted.get(request.contact_id)
        if enrollment is not None:
            results[i] = (enrollment, True)
            continue
        # a concurrent request with the same dedupe_key won, or one enrolled the contact meanwhile
        existing = _by_dedupe_key(conn, project_id, request.dedupe_key) if request.dedupe_key else None
        results[i] = (existing, False) if existing is not None else AlreadyEnrolled(field="contact_id")


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
            check_one_off(Definition(steps=list[Node](request.steps), stop_on=request.stop_on or StopFlags()))
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


def _contacts(conn: Connection[Any], project_id: uuid.UUID, requests: list[EnrollRequest]) -> list[_Contact]:
    """The requests' contacts as stored, in their order, with the project's plan limit and the sequence;
    a project with a plan limit locked first, and its live enrollments read after (one round trip)."""
    params = {
        "project_id": project_id,
        "sequence_id": requests[0].sequence_id,
        "contact_ids": [r.contact_id for r in requests],
        "number_ids": _column([r.number_id for r in requests]),
        "conversation_ids": _column([r.conversation_id for r in requests]),
    }
    with conn.cursor(row_factory=class_row(_Contact)) as cur:
        with buffered_pipeline(conn):
            conn.execute(QUERIES["lock_project"], {"project_id": project_id})
            cur.execute(QUERIES["enrollment_contact"], params, binary=True)
        return cur.fetchall()


def _contact_refusal(request: EnrollRequest, contact: _Contact) -> FollowupsError | None:
    """Why the contact cannot be enrolled, if it cannot: it does not exist or opted out; the number and
    conversation are not the project's and its own."""
    if not contact.found:
        return NotFound("contact not found", field="contact_id")
    if request.number_id is not None and not contact.number_found:
        return NotFound("number not found", field="number_id")
    if request.conversation_id is not None and not contact.conversation_found:
        return NotFound("conversation not found for this contact", field="conversation_id")
    if contact.opted_out:
        return OptedOut(field="contact_id")
    return None


def _pin_version(
    conn: Connection[Any],
    project_id: uuid.UUID,
    request: EnrollRequest,
    sequence: _Contact,
    stop_on: StopFlags,
) -> tuple[Definition, uuid.UUID]:
    """The version the enrollments pin: the sequence's current one, or a one-off version of the request's
    own steps."""
    if request.sequence_id is not None:
        if not sequence.sequence_found:
            raise NotFound("sequence not found", field="sequence_id")
        version_id = sequence.current_version_id
        if version_id is None or sequence.sequence_status == "archived":
            raise SequenceNotEnrollable(
                "the sequence is archived"
                if sequence.sequence_status == "archived"
                else "the sequence has no published version",
                field="sequence_id",
            )
        return version_definition(conn, project_id, version_id), version_id
    assert request.steps is not None
    version = create_one_off_version(
        conn, project_id, Definition(steps=list[Node](request.steps), stop_on=stop_on)
    )
    return version_definition(conn, project_id, version.id), version.id


def _replaced(
    conn: Connection[Any],
    project_id: uuid.UUID,
    sequence_id: uuid.UUID | None,
    requests: list[EnrollRequest],
    definition: Definition,
) -> dict[uuid.UUID, list[_Live]]:
    """Re-entry policy always: the contacts' live enrollments in the sequence, locked (a new enrollment
    replaces its contact's), by contact; nothing under another policy."""
    if definition.reentry != "always" or sequence_id is None or not requests:
        return {}
    params = {
        "project_id": project_id,
        "sequence_id": sequence_id,
        "contact_ids": sorted(r.contact_id for r in requests),
    }
    conn.execute(QUERIES["serialise_reentry"], params)
    replaced: dict[uuid.UUID, list[_Live]] = {}
    with conn.cursor(row_factory=class_row(_Live)) as cur:
        for enrollment in cur.execute(QUERIES["lock_live_in_sequence"], params):
            replaced.setdefault(enrollment.contact_id, []).append(enrollment)
    return replaced


def _insert(
    conn: Connection[Any],
    project_id: uuid.UUID,
    requests: list[EnrollRequest],
    admitted: list[tuple[int, datetime]],
    definition: Definition,
    version_id: uuid.UUID,
    source: str,
    campaign_id: uuid.UUID | None,
    now: datetime,
    brief: bool,
) -> dict[uuid.UUID, Enrollment | Enrolled]:
    """The admitted requests' enrollments (each with its first due time), their stop flags copied from
    the version, by contact, whole or ``brief``; a contact whose dedupe key is known or who is enrolled
    now is missing."""
    if not admitted:
        return {}
    chosen = [requests[i] for i, _ in admitted]
    flags = definition.stop_on
    params = {
        "project_id": project_id,
        "sequence_id": chosen[0].sequence_id,
        "version_id": version_id,
        "source": source,
        "campaign_id": campaign_id,
        "contact_ids": [r.contact_id for r in chosen],
        "conversation_ids": _column([r.conversation_id for r in chosen]),
        "number_ids": _column([r.number_id for r in chosen]),
        "next_run_ats": [due for _, due in admitted],
        "anchor_ats": _column([r.anchor_at for r in chosen]),
        "variables": _json_texts([r.variables for r in chosen]),
        "dedupe_keys": _column([r.dedupe_key for r in chosen]),
        "stop_on_reply": flags.reply,
        "stop_on_human_message": flags.human_message,
        "stop_on_opt_out": flags.opt_out,
        "stop_on_lead_closed": flags.lead_closed,
        "stop_on_conversation_resolved": flags.conversation_resolved,
        "now": now,
    }
    if brief:
        with conn.cursor(row_factory=class_row(Enrolled)) as cur:
            return {e.contact_id: e for e in cur.execute(_INSERT_BRIEF, params, binary=True)}
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        return {e.contact_id: e for e in cur.execute(QUERIES["insert_enrollments"], params, binary=True)}


def _json_texts(values: list[Any]) -> list[str]:
    """Each value as JSON text (for a ``jsonb[]`` column), written once per distinct object: a bulk chunk's
    500 requests share their job's variables."""
    written: dict[int, str] = {}
    texts = []
    for value in values:
        text = written.get(id(value))
        if text is None:
            text = written[id(value)] = json.dumps(value)
        texts.append(text)
    return texts


def _column(values: list[Any]) -> list[Any] | None:
    """A column of a chunk's requests for ``unnest``, or NULL when it holds only NULLs (``unnest`` pads a
    NULL array with NULLs, and the client dumps no element of it)."""
    return values if any(value is not None for value in values) else None


class _Live(msgspec.Struct, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    contact_id: uuid.UUID


def still_sending(conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID) -> bool:
    """Whether the enrollment's messages may still go (active, or completed: not stopped, failed or
    paused); a message sent once and failed for a rate limit is sent again only then."""
    params = {"project_id": project_id, "id": enrollment_id}
    return conn.execute(QUERIES["still_sending"], params).fetchone() is not None


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
        if isinstance(step, MessageStep | AiStep) and step.anchor_offset_seconds is not None:
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
    conn: Connection[Any], project_id: uuid.UUID, enrollment: Enrollment | Enrolled, now: datetime
) -> None:
    """An active enrollment due now: the release service is nudged once the change has committed."""
    due = enrollment.next_run_at
    if enrollment.status == "active" and due is not None and due <= now:
        after_commit(conn, NudgeRelease(project_id, enrollment.id))
