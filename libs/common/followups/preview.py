"""A sequence's time-travel preview: the schedule a contact would get if enrolled now (or at a later
moment), under the current settings, without acting.

The preview does not predict the release path: it runs it. In a savepoint it always rolls back
(:func:`~libs.common.core.effects.rolled_back`, as a rule's dry run does), it

1. enrolls the contact as :func:`~libs.common.followups.enrollments.enroll` would (the same checks: a
   rejection is the preview's answer), without counting or nudging;
2. moves the clock to the enrollment's due time and releases its step with the release step itself
   (:func:`~libs.common.followups.release_step.release_claimed`: the same checks, timing, sending
   constraints and rendering, so the same reason codes), again and again until the enrollment finishes,
   pauses, or one step was deferred :data:`MAX_DEFERRALS` times;
3. reads what each release did: the step's time, its deferrals (until when, and why), the message it
   queued (its text, or its approved template with the parameters filled in) or why it was skipped; for a
   branch, a wait for a reply or a split, the path it took (its ``branched`` run's reason: ``path`` and
   the path's name, ``otherwise``, ``no_reply``, ``variant`` and the variant's name, ``holdout``).

The steps it answers are the ones the contact would take, in the order it would take them (the enrollment's
step after each release: down a branch's path, a wait's timeout path, its variant of a split), then the
steps it would not reach.

What it assumes of the future: the contact does not write, read, opt out or change; each message is sent
as soon as it is queued (so it holds no in-flight or backlog slot); nothing else of the project changes.
A wait for a reply times out (its timeout path) unless the request says ``assume_reply``: then the contact
replies as each wait begins: its message is recorded as the platform records one, and the reply's own stop
path runs (the reply path, or the enrollment stops); like a reply, it locks the contact's live enrollments
until the preview's transaction ends (rolled back).
An AI step is released as the release path would with a model configured (leased, then released with a
draft) but the model is not called: the step says it would be written by the model. Without a model
configured, the step takes its fallback, as it would.

Nothing it writes survives: no enrollment, no message, no step run, no outbox event; the effects the
release registers (a nudge) are dropped with the savepoint.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta, tzinfo
from typing import Any, Final, Literal, get_args

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import Phone, Variables
from libs.common.core import validation
from libs.common.core.db import buffered_pipeline
from libs.common.core.effects import rolled_back
from libs.common.core.errors import Busy, InvalidInput, NotFound
from libs.common.core.metrics import FOLLOWUP_PREVIEWS
from libs.common.core.reasons import Other, split
from libs.common.core.settings import FollowupSettings
from libs.common.core.sql import load_queries
from libs.common.followups import stops
from libs.common.followups.definition import (
    MAX_DELAY_SECONDS,
    AiStep,
    BranchStep,
    Node,
    SplitStep,
    WaitForReplyStep,
)
from libs.common.followups.enrollments import (
    AwareDatetime,
    EnrollmentRejected,
    EnrollmentRejection,
    EnrollRequest,
    create_enrollment,
)
from libs.common.followups.release_ai import release_drafted
from libs.common.followups.release_claim import ClaimedEnrollment, enrollment_to_release
from libs.common.followups.release_step import AiDraft, Released, StepRunReason, release_claimed
from libs.common.followups.send_window import zone
from libs.common.followups.sequences import version_definition, version_number
from libs.common.followups.transitions import EnrollmentReason, WaitingReason
from libs.common.platform import contacts, conversations, projects
from libs.common.platform.contacts import Contact
from libs.common.platform.messages import get_message, record_inbound_message
from libs.common.platform.send_lane import report_sent

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.followups", "preview.sql")

#: Previews of one project that may run at once: each holds a slot (a transaction-scoped advisory lock)
#: until its transaction ends; one more is refused (429, ``busy``), so one project's previews cannot take
#: the API's threads and connections from the others.
PREVIEW_SLOTS: Final = 2
#: Deferrals of one step the preview follows; at the next it stops there (``complete`` false).
MAX_DEFERRALS: Final = 8
#: The draft an AI step is released with in the preview (never shown: the step says the model writes it).
_MODEL_DRAFT: Final = AiDraft(text="(written by the model)")

#: What a step comes to: its message queued, the step skipped, a path taken (a branch, a wait for a reply,
#: a split), the enrollment paused or stopped at it, still deferred when the preview stopped following it,
#: or not reached (the enrollment's path does not go through it, or it ended before).
PreviewOutcome = Literal["queued", "skipped", "branched", "paused", "stopped", "deferred", "not_reached"]
#: Why a step ended as it did: a skip's reason, a queued step's (not sent as written), a stop's or a
#: pause's; the codes the release path records.
StepEnd = Literal[StepRunReason, EnrollmentReason, WaitingReason]
#: A step's kind.
StepKind = Literal["message", "ai", "branch", "wait_for_reply", "split"]


class PreviewRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Whom to preview the sequence for (``contact_id``, or else ``phone``), with the enrollment's anchor
    and variables, enrolled at ``enrolled_at`` (absent: now)."""

    contact_id: uuid.UUID | None = None
    #: The contact's phone (E.164), when no ``contact_id`` is given.
    phone: Phone | None = None
    #: The enrollment's anchor (an anchor-timed step is due at its offset from it).
    anchor_at: AwareDatetime | None = None
    variables: Variables = msgspec.field(default_factory=dict)
    #: When the contact would be enrolled: now (absent) or later, at most a year ahead.
    enrolled_at: AwareDatetime | None = None
    #: The contact replies as each wait for a reply begins (false: no reply, each wait times out).
    assume_reply: bool = False


class PreviewTemplate(msgspec.Struct, kw_only=True, frozen=True):
    """The approved WhatsApp template a step would go out as (outside the service window)."""

    name: str
    language: str
    parameters: list[str]


class Deferral(msgspec.Struct, kw_only=True, frozen=True):
    """A release of the step that would not send yet: when, why, and until when."""

    at: datetime
    reason: Literal[WaitingReason, Other]
    reason_detail: str | None
    until: datetime


class PreviewStep(msgspec.Struct, kw_only=True, frozen=True):
    """What one step would do, and when (the steps in the order the contact would take them)."""

    step_index: int
    kind: StepKind
    outcome: PreviewOutcome
    #: When the step would first fall due (null: not reached).
    due_at: datetime | None = None
    #: When it would go, be skipped, or stop or pause the enrollment (null: deferred or not reached).
    at: datetime | None = None
    #: ``at`` on the contact's wall clock (its zone, else the project's), with its offset.
    local_at: str | None = None
    #: Why: a skip's reason, a queued step's reason when not sent as written (``service_window_template``,
    #: ``ai_fallback``), the path taken (``path``, ``otherwise``, ``replied``, ``no_reply``, ``variant``,
    #: ``holdout``; the path's or variant's name in ``reason_detail``), the stop's or the pause's; the same
    #: codes as the release path records.
    reason: Literal[StepEnd, Other] | None = None
    reason_detail: str | None = None
    deferrals: list[Deferral] = msgspec.field(default_factory=list)
    #: The message's text, its placeholders filled in (null: not queued, a template, or the model's).
    text: str | None = None
    template: PreviewTemplate | None = None
    #: An AI step whose message the model would write (it is not called for a preview).
    written_by_model: bool = False


class Preview(msgspec.Struct, kw_only=True, frozen=True):
    """The schedule a contact would get in a sequence's current version."""

    sequence_id: uuid.UUID
    #: The version the enrollment would pin (null: rejected before one was pinned).
    version: int | None
    contact_id: uuid.UUID
    enrolled_at: datetime
    anchor_at: datetime | None
    #: The zone the steps' local times are read in (the contact's, else the project's).
    timezone: str
    #: Why the contact could not be enrolled (null: it could); no steps then.
    rejected: EnrollmentRejection | None
    rejected_message: str | None
    steps: list[PreviewStep]
    #: Whether the preview followed the enrollment to its end (false: a step was still deferred after
    #: MAX_DEFERRALS releases; that step is ``deferred``, the ones after it ``not_reached``).
    complete: bool
    previewed_at: datetime


def preview(
    conn: Connection[Any],
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    request: PreviewRequest,
    settings: FollowupSettings,
    *,
    now: datetime,
    ai_lease: timedelta | None = None,
) -> Preview:
    """The schedule ``request``'s contact would get in the project's sequence (see the module), without
    acting: nothing it writes survives. ``ai_lease``: a model is configured (as the release service is
    given it). 404 for another project's sequence or contact; 422 naming ``contact_id``, ``phone``,
    ``enrolled_at``, ``anchor_at`` or ``variables`` for what cannot be previewed."""
    contact = _contact(conn, project_id, request)
    enrolled_at = _enrolled_at(request.enrolled_at, now)
    _take_slot(conn, project_id)
    tz = _zone(conn, project_id, contact)
    enroll = EnrollRequest(
        contact_id=contact.id,
        sequence_id=sequence_id,
        variables=request.variables,
        anchor_at=request.anchor_at,
    )
    version: int | None = None
    rejected: EnrollmentRejected | None = None
    steps: list[PreviewStep] = []
    complete = True
    try:
        # pipeline mode (as the release loop's): the writes no read waits for travel together
        with buffered_pipeline(conn), rolled_back(conn):
            # what counts skips a preview (migration 0030): it holds no counter row, nor the plan lock, that a
            # real enrollment, release or send would wait for; local, it ends with the savepoint
            conn.execute("SELECT set_config('followups.preview', 'on', true)")
            enrollment, _ = create_enrollment(conn, project_id, enroll, now=enrolled_at, source="preview")
            version = version_number(conn, project_id, enrollment.version_id)
            steps, complete = _follow(
                conn,
                project_id,
                enrollment.id,
                enrollment.version_id,
                enrolled_at,
                settings,
                tz,
                ai_lease,
                assume_reply=request.assume_reply,
            )
    except OverflowError as exc:  # a step's time (its anchor, a grace or a wait after it) past the calendar
        raise InvalidInput(
            "anchor_at puts a step, or a wait after it, beyond the last date that can be written",
            field="anchor_at",
        ) from exc
    except EnrollmentRejected as rejection:
        if rejection.code == "sequence_not_enrollable":
            raise  # the sequence's fault, not the contact's: as enroll answers it
        rejected = rejection
    result = rejected.code if rejected else "complete" if complete else "incomplete"
    FOLLOWUP_PREVIEWS.labels(result or "rejected").inc()
    log.info(
        "sequence previewed",
        extra={
            "project_id": str(project_id),
            "sequence_id": str(sequence_id),
            "contact_id": str(contact.id),
            "result": result,
            "version": version,
            "steps": len(steps),
            "assume_reply": request.assume_reply,
        },
    )
    return Preview(
        sequence_id=sequence_id,
        version=version,
        contact_id=contact.id,
        enrolled_at=enrolled_at,
        anchor_at=request.anchor_at,
        timezone=str(tz),
        rejected=rejected.code if rejected else None,
        rejected_message=rejected.message if rejected else None,
        steps=steps,
        complete=complete,
        previewed_at=now,
    )


def _contact(conn: Connection[Any], project_id: uuid.UUID, request: PreviewRequest) -> Contact:
    """The request's contact, by id or by phone (404 naming the field given)."""
    if (request.contact_id is None) == (request.phone is None):
        raise InvalidInput("give either contact_id or phone", field="contact_id")
    if request.contact_id is not None:
        return contacts.get_contact(conn, project_id, request.contact_id)
    assert request.phone is not None
    found = contacts.list_contacts(conn, project_id, limit=1, phone=validation.phone(request.phone))
    if not found:
        raise NotFound("contact not found", field="phone")
    return found[0]


def _zone(conn: Connection[Any], project_id: uuid.UUID, contact: Contact) -> tzinfo:
    """The zone the release path reads the contact's wall clock in: its own, else its project's."""
    project = projects.project_name(conn, project_id)
    return zone(contact.timezone, project[1] if project else None)


def _take_slot(conn: Connection[Any], project_id: uuid.UUID) -> None:
    """One of the project's :data:`PREVIEW_SLOTS`, held until the caller's transaction ends; Busy when
    every one is taken (never waits)."""
    for slot in range(PREVIEW_SLOTS):
        row = conn.execute(QUERIES["take_preview_slot"], {"key": f"preview:{project_id}:{slot}"}).fetchone()
        if row is not None and row[0]:
            return
    FOLLOWUP_PREVIEWS.labels("busy").inc()
    log.info("sequence preview refused: busy", extra={"project_id": str(project_id)})
    raise Busy(f"{PREVIEW_SLOTS} previews of this project are running: try again in a moment")


def _enrolled_at(requested: datetime | None, now: datetime) -> datetime:
    """When the preview enrolls the contact: now, or the moment asked (not past, at most a year ahead)."""
    if requested is None:
        return now
    if requested < now:
        raise InvalidInput(
            "enrolled_at must not be in the past: the preview reads the contact as it is now",
            field="enrolled_at",
        )
    if requested - now > timedelta(seconds=MAX_DELAY_SECONDS):
        raise InvalidInput("enrolled_at must be at most a year ahead", field="enrolled_at")
    return requested


def _follow(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    version_id: uuid.UUID,
    enrolled_at: datetime,
    settings: FollowupSettings,
    tz: tzinfo,
    ai_lease: timedelta | None,
    *,
    assume_reply: bool,
) -> tuple[list[PreviewStep], bool]:
    """Release the enrollment at each of its due times (in the caller's savepoint) until it is no longer
    active: each step's outcome in the order taken, and whether the enrollment was followed to its end."""
    definition = version_definition(conn, project_id, version_id)
    kinds = [_kind(step) for step in definition.steps]
    steps: list[PreviewStep] = []
    deferrals: list[Deferral] = []
    complete = True
    clock = enrolled_at  # the preview's clock: it only moves forward, to each due time
    row = enrollment_to_release(conn, project_id, enrollment_id)
    while row is not None:
        kind = kinds[row.step_index]
        if assume_reply and kind == "wait_for_reply":
            # the contact replies as the wait begins (the clock: the previous step's release)
            steps.append(_replied(conn, row, kind, clock, tz))
            row = enrollment_to_release(conn, project_id, enrollment_id)
            continue
        # a step due before the clock (an anchor's offset already past) is released now, as it would be
        at = clock = max(row.next_run_at, clock)
        released, by_model = _release(conn, row, settings, at, ai_lease)
        following = enrollment_to_release(conn, project_id, enrollment_id)
        if released.action == "defer":
            assert following is not None  # a deferred enrollment stays active
            code, detail = split(released.reason, WAITING_REASONS)
            assert code is not None  # a deferral has its reason
            deferrals.append(Deferral(at=at, reason=code, reason_detail=detail, until=following.next_run_at))
            if len(deferrals) > MAX_DEFERRALS:
                # still held back: the preview stops following it here
                steps.append(
                    PreviewStep(
                        step_index=row.step_index,
                        kind=kind,
                        outcome="deferred",
                        due_at=deferrals[0].at,
                        deferrals=deferrals,
                    )
                )
                complete = False
                break
        else:
            steps.append(_went(conn, row, kind, deferrals, at, released, by_model, tz))
            if released.message_id is not None:  # sent at once: it holds no in-flight or backlog slot
                report_sent(
                    conn, project_id, [(released.message_id, f"preview-{released.message_id}")], now=at
                )
            deferrals = []
        row = following
    # the steps the enrollment would not reach (off its path, it ended before them, or the preview stopped)
    taken = {step.step_index for step in steps}
    steps += [
        PreviewStep(step_index=i, kind=kind, outcome="not_reached")
        for i, kind in enumerate(kinds)
        if i not in taken
    ]
    return steps, complete


def _replied(
    conn: Connection[Any], row: ClaimedEnrollment, kind: StepKind, at: datetime, tz: tzinfo
) -> PreviewStep:
    """A wait for a reply the contact replies to at ``at``: its message recorded as the platform records
    one (its last inbound time, so the service window opens; its conversation waits for an answer), then the
    reply's stop path (the enrollment takes the wait's reply path, or stops)."""
    project_id, contact_id = row.project_id, row.contact_id
    conversation_id = conversations.open_conversation_id(conn, project_id, contact_id)
    if conversation_id is None:
        conversation_id = conversations.create_conversation(conn, project_id, contact_id, now=at)[0].id
    record_inbound_message(
        conn,
        project_id,
        contact_id,
        conversation_id,
        provider_message_id=f"preview-reply-{row.id}-{row.step_index}",
        body=None,
        media_url=None,
        media_kind=None,
        now=at,
    )
    stopped = stops.stop_followups_for_contact(conn, project_id, contact_id, "reply", now=at)
    outcome: PreviewOutcome = "stopped" if row.id in stopped.enrollment_ids else "branched"
    return PreviewStep(
        step_index=row.step_index,
        kind=kind,
        outcome=outcome,
        due_at=at,
        at=at,
        local_at=at.astimezone(tz).isoformat(),
        reason="replied",
    )


def _release(
    conn: Connection[Any],
    row: ClaimedEnrollment,
    settings: FollowupSettings,
    at: datetime,
    ai_lease: timedelta | None,
) -> tuple[Released, bool]:
    """What the release path does with the step at ``at``, and whether the model's draft would go out (an
    AI step it leases is released with a stand-in draft: the model is not called)."""
    released = release_claimed(conn, row, settings, now=at, ai_lease=ai_lease)
    if released.action != "lease":
        return released, False
    assert released.fence is not None
    drafted = release_drafted(
        conn, row.project_id, row.id, row.step_index, released.fence, _MODEL_DRAFT, settings, now=at
    )
    assert drafted is not None  # the preview's own enrollment: nothing else fences it out
    return drafted, drafted.action == "queue" and drafted.reason is None


def _went(
    conn: Connection[Any],
    row: ClaimedEnrollment,
    kind: StepKind,
    deferrals: list[Deferral],
    at: datetime,
    released: Released,
    by_model: bool,
    tz: tzinfo,
) -> PreviewStep:
    """A step queued or skipped, or the enrollment stopped or paused at it (after its deferrals)."""
    code, detail = split(released.reason, REASONS)
    text, template = None, None
    if released.message_id is not None and not by_model:
        message = get_message(conn, row.project_id, released.message_id)
        text = message.body
        if message.template_name is not None:
            template = PreviewTemplate(
                name=message.template_name,
                language=message.template_language or "",
                parameters=message.template_parameters or [],
            )
    return PreviewStep(
        step_index=row.step_index,
        kind=kind,
        outcome=_OUTCOMES[released.action],
        due_at=deferrals[0].at if deferrals else at,
        at=at,
        local_at=at.astimezone(tz).isoformat(),
        reason=code,
        reason_detail=detail,
        deferrals=deferrals,
        text=text,
        template=template,
        written_by_model=by_model,
    )


def _kind(step: Node) -> StepKind:
    if isinstance(step, BranchStep):
        return "branch"
    if isinstance(step, WaitForReplyStep):
        return "wait_for_reply"
    if isinstance(step, SplitStep):
        return "split"
    return "ai" if isinstance(step, AiStep) else "message"


#: The waiting reasons a deferral reads.
WAITING_REASONS: Final[frozenset[WaitingReason]] = frozenset(get_args(WaitingReason))
#: The reasons a step's end reads: a skip's, a queued step's, a stop's or a pause's.
REASONS: Final[frozenset[StepEnd]] = frozenset(get_args(StepEnd))
_OUTCOMES: Final[dict[str, PreviewOutcome]] = {
    "queue": "queued",
    "skip": "skipped",
    "branch": "branched",
    "pause": "paused",
    "stop": "stopped",
}
