"""One step, one transaction: the release step of seed 000, for an enrollment the caller has claimed.

    contact   FOR SHARE SKIP LOCKED, read with the claim (:mod:`~libs.common.followups.release_state`)
              (busy: retry in FOLLOWUP_BUSY_RETRY_SECONDS; never wait for a lock)
    checks    sequence paused -> pause; plan lost -> stop; opted out / erased / undeliverable -> stop;
              replied -> stop
    timing    rescheduled -> defer; reminder past grace -> skip; only_if not met -> skip
    sending   constraints (send window, consent, number, pacing, quotas, caps): see _sending_constraints
    render    missing vars.* / anchor.* -> skip
    queue     the message (with its followup_sent activity: messages.message_to_queue), the step run,
              followup.step_queued and the advance in one statement (to the step's next: the following
              one, a later one by id, or the end)
    route     a branch, a wait for a reply or a split sends nothing: after the checks, its path is decided
              (:mod:`~libs.common.followups.release_route`), its step run is ``branched``, and the
              enrollment moves down the path

The release (:mod:`~libs.common.followups.release`) claims (``FOR UPDATE SKIP LOCKED``) and calls
:func:`release_claimed`; the AI step's second pass (:mod:`~libs.common.followups.release_ai`) calls it too,
under its own lock. Each returns a :class:`Released`, which the caller counts once its transaction
committed (the chain's :class:`~libs.common.followups.release.Tally`, or
:func:`~libs.common.followups.release.observe` for one step). An unexpected error rolls
the transaction back; :func:`record_failure` then backs the enrollment off exponentially and fails it
after FOLLOWUP_MAX_FAILURES, so a poison row cannot hot-loop.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.contracts.events import Event, StepSkipped
from libs.common.core.jobs import Backoff
from libs.common.core.reasons import stored
from libs.common.core.settings import FollowupSettings
from libs.common.core.sql import load_queries
from libs.common.followups import constraints, graph, held, transitions
from libs.common.followups.constraints import Claimed, ConstraintSkip, Hold, Sending
from libs.common.followups.definition import (
    AiStep,
    BranchStep,
    Definition,
    MessageStep,
    Node,
    Step,
    TemplateFallback,
    WhatsAppTemplate,
    step_due_at,
)
from libs.common.followups.graph import sending_step
from libs.common.followups.held import HeldValues
from libs.common.followups.project_settings import DEFAULTS
from libs.common.followups.release_claim import ClaimedEnrollment
from libs.common.followups.release_route import RouteReason, route
from libs.common.followups.release_state import ReadWithClaim, ReleaseState, read_state
from libs.common.followups.sequences import version_definition
from libs.common.followups.step_messages import (
    TEMPLATE_REASON,
    StepContent,
    StepOf,
    step_message,
    template_parameters,
)
from libs.common.followups.templates import RenderContext, TemplateSkip, render_message
from libs.common.followups.transitions import FinalStatus, StepOutcome
from libs.common.platform.messages import (
    ConversationBusy,
    LockedConversation,
    message_to_queue,
)

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.followups", "release_step.sql")

#: What one release transaction did (``branch``: a step that sends nothing took a path).
Action = Literal["queue", "skip", "defer", "pause", "stop", "retry", "fail", "lease", "branch"]

#: Why an AI step's draft is not sent (the step takes its fallback): no model (``ai_unavailable``), the
#: project's monthly token budget used up, the call timed out or failed, an answer that cannot be used, not
#: confident enough, or breaking the step's output policy (:mod:`libs.common.ai`).
AiFallbackReason = Literal[
    "ai_unavailable",
    "ai_budget_exhausted",
    "ai_timeout",
    "ai_error",
    "ai_invalid_output",
    "ai_low_confidence",
    "ai_policy",
]
#: Why a step run went as it did (``followup_step_runs.reason``; :func:`_run` keeps it with
#: its detail). Skipped: an ``only_if`` not met (detail: the condition), released past its grace
#: (``past_due``), a missing value (``missing_variable``, detail: the placeholder; ``missing_anchor``), a
#: text too long, a sending constraint (no consent, outside the service window), an AI step's reason when
#: it has no fallback. Queued: as the approved WhatsApp template (``service_window_template``), or as an AI
#: step's fallback (``ai_fallback``, detail: why, an :data:`AiFallbackReason` or ``model_unavailable``
#: when no model is configured). Null: queued as written.
StepRunReason = Literal[
    "only_if",
    "past_due",
    TemplateSkip,
    ConstraintSkip,
    AiFallbackReason,
    "service_window_template",
    "ai_fallback",
    RouteReason,
]


class Released(msgspec.Struct, frozen=True):
    """What one release transaction did: queue, skip, defer, pause, stop, retry or fail."""

    enrollment_id: uuid.UUID
    action: Action
    reason: str | None = None
    message_id: uuid.UUID | None = None
    #: Queued time minus the step's due time (queue only).
    lag_seconds: float | None = None
    #: The status the enrollment finished with in this transaction (its last step, a stop, a failure).
    finished: FinalStatus | None = None
    #: An AI step leased for its model call (action ``lease``): its project, fence and step.
    project_id: uuid.UUID | None = None
    fence: int | None = None
    step_index: int | None = None


class _Claim(msgspec.Struct, frozen=True):
    """The claimed enrollment, its contact's state, and the step due."""

    row: ClaimedEnrollment
    state: ReleaseState
    definition: Definition
    now: datetime

    @property
    def id(self) -> uuid.UUID:
        return self.row.id

    @property
    def step(self) -> Step:
        return sending_step(self.definition, self.row.step_index)


@dataclass(frozen=True)
class AiDraft:
    """What the model call of an AI step came to: the message to send, or why its fallback is taken
    (``ai_low_confidence``, ``ai_invalid_output``, ``ai_error``, ``ai_timeout``, ``ai_budget_exhausted``,
    ``ai_policy``)."""

    text: str | None = None
    fallback_reason: AiFallbackReason | None = None


def release_claimed(
    conn: Connection[Any],
    row: ClaimedEnrollment,
    settings: FollowupSettings,
    *,
    now: datetime,
    ai_lease: timedelta | None = None,
    draft: AiDraft | None = None,
    read: ReadWithClaim | None = None,
) -> Released:
    """Release the claimed enrollment's due step, in the caller's transaction (which holds its lock);
    ``read``: the contact's state read with the claim (:func:`claim_release`), used when this step's own
    read would be the same.

    An AI step is released in two passes: the first (``ai_lease`` set: a model is configured) leases the
    step after the checks and returns ``lease``; the model is called holding no lock; the second pass
    (:func:`release_drafted`, with the ``draft``) re-runs every check and constraint and queues the draft or
    the fallback. Without a model configured, an AI step takes its fallback at once."""
    definition = version_definition(conn, row.project_id, row.version_id)
    node = definition.steps[row.step_index]
    params = {
        "project_id": row.project_id,
        "contact_id": row.contact_id,
        "sequence_id": row.sequence_id,
        # replies before the enrollment took a reply path no longer stop it
        "enrolled_at": max(row.enrolled_at, row.reply_taken_at or row.enrolled_at),
        # the previous message's status is read only for the step that asks whether it was read
        "last_message_id": row.last_message_id if _reads_previous(node) else None,
        "number_id": row.number_id,
        "fixed_number_id": definition.number_id,
        "conversation_id": row.conversation_id,
        "default_recipient_gap": DEFAULTS.min_recipient_gap_seconds,
        "now": now,
    }
    if read is not None and params["last_message_id"] is None and params["fixed_number_id"] is None:
        state = read.state  # the claim read it so
    else:
        state = read_state(conn, params)
    if state is None:  # the contact is locked by a stop path: come back shortly
        return _busy(conn, row, now, settings, "contact")
    claim = _Claim(row, state, definition, now)
    if graph.is_control(node):
        return _checks(conn, claim) or _route(conn, claim)
    checked = _checks(conn, claim) or _timing(conn, claim)
    if checked is not None:
        return checked
    decision = constraints.check(conn, _constrained(row), claim.step, definition, state, now)
    if isinstance(decision, Hold):
        return _hold(conn, claim, decision)
    if isinstance(claim.step, AiStep) and draft is None and ai_lease is not None:
        # only a step that could go out now is written: the model never sees a contact the step may not
        # reach (no consent, outside the window, no number), and is not called again at each deferral
        fence = transitions.lease(conn, row.project_id, claim.id, now + ai_lease)
        log.info(
            "ai step leased",
            extra={"enrollment_id": str(claim.id), "step_index": row.step_index, "fence": fence},
        )
        return Released(
            claim.id, "lease", "ai_step", project_id=row.project_id, fence=fence, step_index=row.step_index
        )
    content, reason, detail = _render(claim, decision.template, draft)
    if content is None:
        assert reason is not None
        return _skip(conn, claim, reason, detail)
    if state.open_conversation_busy:  # another transaction holds the contact's open conversation
        return _busy(conn, row, now, settings, "conversation")
    try:
        return _queue(conn, claim, content, reason, detail, decision)
    except ConversationBusy:  # none was open, and one opened meanwhile is held
        return _busy(conn, row, now, settings, "conversation")


def _reads_previous(node: Node) -> bool:
    """Whether the step asks whether the previous follow-up was read (an ``only_if``, a branch's path)."""
    if isinstance(node, MessageStep | AiStep):
        return "previous_not_read" in node.only_if
    return isinstance(node, BranchStep) and any(path.read is not None for path in node.paths)


def _route(conn: Connection[Any], claim: _Claim) -> Released:
    """A step that sends nothing: its path decided, recorded as its ``branched`` run, and taken."""
    row, state = claim.row, claim.state
    taken = route(
        conn,
        row,
        claim.definition,
        replied_at=state.replied_at,
        last_message_status=state.last_message_status,
    )
    if taken.target is None:  # replied to, at a wait whose reply stops the enrollment
        return _stop(conn, claim, "replied")
    recorded = stored(taken.reason, taken.detail)
    log.info(
        "path taken",
        extra={
            "project_id": str(row.project_id),
            "enrollment_id": str(claim.id),
            "step_index": row.step_index,
            "path": recorded,
        },
    )
    finished = _advance(conn, claim, _run(claim, "branched", recorded), None, [], target=taken.target)
    return Released(claim.id, "branch", recorded, finished=finished)


def _constrained(row: ClaimedEnrollment) -> Claimed:
    return Claimed(
        row.id, row.project_id, row.number_id, row.waiting_reason, row.unavailable_since, row.contact_id
    )


def _hold(conn: Connection[Any], claim: _Claim, hold: Hold) -> Released:
    """A sending constraint holds the step back: defer it, skip it, or pause the enrollment."""
    if hold.action == "skip":
        assert hold.reason in ("no_consent", "outside_service_window"), hold  # the holds that skip
        return _skip(conn, claim, hold.reason, values=hold.values)
    if hold.action == "pause":
        assert hold.reason == "instance_unavailable", hold  # the one hold that pauses
        transitions.pause(conn, claim.row.project_id, [claim.id], "instance_unavailable", now=claim.now)
        log.info("enrollment paused", extra={"enrollment_id": str(claim.id), "reason": hold.reason})
        return Released(claim.id, "pause", hold.reason)
    assert hold.until is not None
    return _defer(
        conn, claim.row, hold.until, hold.reason, unavailable_since=hold.unavailable_since, values=hold.values
    )


def _checks(conn: Connection[Any], claim: _Claim) -> Released | None:
    """Sequence paused -> pause; plan lost -> stop; opted out, erased or undeliverable -> stop; replied ->
    stop."""
    state = claim.state
    if state.sequence_status == "paused":
        transitions.pause(conn, claim.row.project_id, [claim.id], "sequence_paused", now=claim.now)
        return Released(claim.id, "pause", "sequence_paused")
    if not state.plan_active:
        return _stop(conn, claim, "plan_lost")
    if state.erased:
        return _stop(conn, claim, "contact_erased")
    if state.opted_out:
        return _stop(conn, claim, "opted_out")
    if state.undeliverable:
        return _stop(conn, claim, "undeliverable")
    if claim.row.stop_on_reply and state.replied_at is not None and claim.row.reply_step is None:
        # the backstop: the reply's own stop path normally got here first (a wait with a reply path takes
        # it instead: see _route)
        return _stop(conn, claim, "replied")
    return None


def _timing(conn: Connection[Any], claim: _Claim) -> Released | None:
    """Rescheduled -> defer; reminder past its grace -> skip; ``only_if`` not met -> skip."""
    step, row, now = claim.step, claim.row, claim.now
    if step.anchor_offset_seconds is not None:
        due = step_due_at(step, now=now, anchor_at=row.anchor_at)
        if due is None:
            return _skip(conn, claim, "missing_anchor")
        if due > now:
            return _defer(conn, claim.row, due, "rescheduled", values={"due_at": held.moment(due)})
        if now > due + timedelta(seconds=step.grace_seconds):
            values = {"due_at": held.moment(due), "grace_seconds": step.grace_seconds}
            return _skip(conn, claim, "past_due", values=values)
    state = claim.state
    for condition in step.only_if:
        met = {
            "no_reply_since_previous_step": not _replied_since(state, row.last_step_at),
            "no_reply_since_enrollment": state.replied_at is None,
            "previous_not_read": state.last_message_status != "READ",
        }[condition]
        if not met:
            values = (
                {"last_message_status": state.last_message_status}
                if condition == "previous_not_read"
                else {"replied_at": held.moment(state.replied_at)}
            )
            return _skip(conn, claim, "only_if", condition, values=values)
    return None


def _replied_since(state: ReleaseState, moment: datetime | None) -> bool:
    """Whether the contact's last reply since enrollment came after ``moment`` (None: since enrollment)."""
    return state.replied_at is not None and (moment is None or state.replied_at > moment)


def _render(
    claim: _Claim, template: WhatsAppTemplate | None, draft: AiDraft | None = None
) -> tuple[StepContent | None, StepRunReason | None, str | None]:
    """What to send (or None), the reason and its detail: the skip reason, or why a fallback or template
    was used."""
    step = claim.step
    if template is not None:
        parameters, skip, skip_detail = template_parameters(template, _render_context(claim))
        if parameters is None:
            return None, skip, skip_detail
        return StepContent(None, template, parameters), TEMPLATE_REASON, None
    fallen_back: str | None = None  # why an AI step sends its fallback
    if isinstance(step, MessageStep):
        text = step.text
    else:
        assert isinstance(step, AiStep)
        if draft is not None and draft.text is not None:
            return StepContent(draft.text), None, None  # the model's words, sent as written (not a template)
        # no model configured, or its answer cannot be used: the step's fallback
        reason = draft.fallback_reason if draft is not None else None
        if not isinstance(step.fallback, TemplateFallback):
            return None, reason or "ai_unavailable", None
        text, fallen_back = step.fallback.text, reason or "model_unavailable"
    rendered = render_message(text, _render_context(claim))  # too long once filled in: message_too_long
    if rendered.text is None:
        return None, rendered.skip_reason, rendered.skip_detail
    if fallen_back is not None:
        return StepContent(rendered.text), "ai_fallback", fallen_back
    return StepContent(rendered.text), None, None


def _render_context(claim: _Claim) -> RenderContext:
    state, row = claim.state, claim.row
    return RenderContext(
        variables=row.variables,
        anchor_at=row.anchor_at,
        timezone=state.timezone,
        fallback_timezone=state.project_timezone,
        contact_name=state.name,
        contact_phone=state.phone,
        contact_attributes=state.attributes,
    )


def _queue(
    conn: Connection[Any],
    claim: _Claim,
    content: StepContent,
    reason: StepRunReason | None,
    detail: str | None,
    sending: Sending,
) -> Released:
    row, now, step = claim.row, claim.now, claim.step
    recorded = stored(reason, detail) if reason is not None else None  # as the step run keeps it
    media = step if isinstance(step, MessageStep) and content.template is None else None
    of = StepOf(
        row.project_id,
        row.contact_id,
        claim.id,
        row.step_index,
        row.sequence_id,
        row.version_id,
        row.campaign_id,
        row.conversation_id,
    )
    locked = (
        LockedConversation(claim.state.open_conversation_id, claim.state.open_conversation_number_id)
        if claim.state.open_conversation_id is not None
        else None
    )
    message, event = step_message(conn, of, content, sending.number_id, recorded, media)
    # the message's writes go in the statement that moves the enrollment on (one statement fewer a step)
    queued, writes = message_to_queue(conn, message, now=now, conversation=locked)
    constraints.after_queued(conn, row.project_id, sending, now)
    lag = max(0.0, (now - (row.step_due_at or row.next_run_at)).total_seconds())
    log.info(
        "step queued",
        # the ids as they are: the formatter writes them (msgspec's UUIDs in JSON), and nothing when unlogged
        extra={
            "project_id": row.project_id,
            "enrollment_id": claim.id,
            "step_index": row.step_index,
            "message_id": queued.message_id,
            "lag_seconds": round(lag, 3),
        },
    )
    run = _run(claim, "queued", recorded)
    finished = _advance(
        conn, claim, run, queued.message_id, [queued.event, event], queued.conversation_id, message=writes
    )
    return Released(claim.id, "queue", recorded, queued.message_id, lag_seconds=lag, finished=finished)


def _skip(
    conn: Connection[Any],
    claim: _Claim,
    reason: StepRunReason,
    detail: str | None = None,
    *,
    values: HeldValues | None = None,
) -> Released:
    row = claim.row
    recorded = stored(reason, detail)  # as the step run keeps it
    event = StepSkipped(
        enrollment_id=claim.id,
        sequence_id=row.sequence_id,
        contact_id=row.contact_id,
        step_index=row.step_index,
        reason=recorded,
    )
    log.info(
        "step skipped",
        extra={
            "project_id": str(row.project_id),
            "enrollment_id": str(claim.id),
            "step_index": row.step_index,
            "reason": recorded,
            "values": values,
        },
    )
    finished = _advance(conn, claim, _run(claim, "skipped", recorded, values), None, [event])
    return Released(claim.id, "skip", recorded, finished=finished)


def _run(
    claim: _Claim, outcome: StepOutcome, recorded: str | None, values: HeldValues | None = None
) -> transitions.StepRun:
    """The step's run, written with the move that follows it (:func:`_advance`): its reason as stored, with
    its detail (``only_if:previous_not_read``), and, for a step held back, the values the check compared
    (:mod:`~libs.common.followups.held`)."""
    row = claim.row
    return transitions.StepRun(row.step_index, outcome, recorded, row.step_due_at or row.next_run_at, values)


def _advance(
    conn: Connection[Any],
    claim: _Claim,
    run: transitions.StepRun,
    message_id: uuid.UUID | None,
    events: list[Event],
    conversation_id: uuid.UUID | None = None,
    *,
    target: int | None = None,
    message: dict[str, Any] | None = None,
) -> FinalStatus | None:
    """Schedule the next step (the step's ``next``, or ``target``: where a path goes) from now, or complete
    the enrollment at the end of its path (returns ``completed`` then); the step's ``run`` and ``events``
    are written in the same statement (with the completion's events), and the step's queued ``message``
    (:func:`~libs.common.platform.messages.message_to_queue`'s writes) when there is one. The conversation
    the step's message went to becomes the enrollment's when it had none."""
    definition = claim.definition
    next_index = graph.following(definition, claim.row.step_index) if target is None else target
    if next_index != graph.END:
        next_step = definition.steps[next_index]
        due = step_due_at(next_step, now=claim.now, anchor_at=claim.row.anchor_at) or claim.now
        if isinstance(next_step, MessageStep | AiStep):
            if message_id is not None:  # the next step keeps the contact's spacing (no deferral needed)
                due = max(due, claim.now + timedelta(seconds=claim.state.min_recipient_gap_seconds))
            due = constraints.in_window(next_step, definition, claim.state, due)
        transitions.advance(
            conn,
            claim.row.project_id,
            claim.id,
            next_index,
            due,
            message_id,
            now=claim.now,
            conversation_id=conversation_id,
            reply_step=graph.reply_step(definition, next_index),
            run=run,
            events=events,
            message=message,
        )
        return None
    transitions.finish(
        conn,
        claim.row.project_id,
        [claim.row],
        "completed",
        None,
        now=claim.now,
        step_index=len(definition.steps),
        message_id=message_id,
        conversation_id=conversation_id,
        preceding=events,
        run=run,
        message=message,
    )
    return "completed"


def _stop(conn: Connection[Any], claim: _Claim, reason: transitions.EnrollmentReason) -> Released:
    transitions.finish(conn, claim.row.project_id, [claim.row], "stopped", reason, now=claim.now)
    log.info("enrollment stopped", extra={"enrollment_id": str(claim.id), "reason": reason})
    return Released(claim.id, "stop", reason, finished="stopped")


def _busy(
    conn: Connection[Any],
    row: ClaimedEnrollment,
    now: datetime,
    settings: FollowupSettings,
    locked: Literal["contact", "conversation"],
) -> Released:
    """Another transaction holds the contact or its open conversation: come back shortly (``busy``)."""
    retry = now + timedelta(seconds=settings.busy_retry_seconds)
    return _defer(conn, row, retry, "busy", values={"locked": locked})


def _defer(
    conn: Connection[Any],
    row: ClaimedEnrollment,
    until: datetime,
    reason: str,
    *,
    unavailable_since: datetime | None = None,
    values: HeldValues | None = None,
) -> Released:
    transitions.defer(
        conn, row.project_id, row.id, until, reason, unavailable_since=unavailable_since, values=values
    )
    return Released(row.id, "defer", reason)


def backoff(failures: int, settings: FollowupSettings) -> timedelta:
    """Exponential backoff after the n-th consecutive failure: min, 2*min, ... capped at max."""
    most = timedelta(seconds=settings.backoff_max_seconds)
    return Backoff(first=timedelta(seconds=settings.backoff_min_seconds), most=most).delay(failures)


class _Finishing(msgspec.Struct, frozen=True):
    id: uuid.UUID
    project_id: uuid.UUID
    sequence_id: uuid.UUID | None
    contact_id: uuid.UUID


def record_failure(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    exc: Exception,
    now: datetime,
    settings: FollowupSettings,
) -> Released:
    """The release transaction rolled back: count the failure, back off, or fail the enrollment, in a
    transaction of its own on ``conn`` (idle), committed here."""
    error = f"{type(exc).__name__}: {exc}"[:1000]
    with conn.transaction():
        failures = transitions.count_failure(conn, project_id, enrollment_id, error)
        if failures is None:  # finished meanwhile (stopped, say): nothing left to retry
            return Released(enrollment_id, "retry", error)
        if failures >= settings.max_failures:
            with conn.cursor(row_factory=class_row(_Finishing)) as cur:
                params = {"project_id": project_id, "id": enrollment_id}
                row = cur.execute(QUERIES["failing_enrollment"], params).fetchone()
            assert row is not None  # counted just now, under its lock
            transitions.finish(conn, row.project_id, [row], "failed", "error", now=now)
            released = Released(enrollment_id, "fail", error, finished="failed")
        else:
            transitions.defer(conn, project_id, enrollment_id, now + backoff(failures, settings), "error")
            released = Released(enrollment_id, "retry", error)
    log.warning(
        "release failed",
        extra={
            "enrollment_id": str(enrollment_id),
            "failures": failures,
            "action": released.action,
            "error": error,
        },
        exc_info=exc,
    )
    return released
