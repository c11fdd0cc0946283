"""The one home of every change to an enrollment after it was created (``followup_enrollments`` is
updated here and nowhere else): advance, defer, pause, resume, finish (a goal met converts, an exit
criterion met exits), a late conversion, a counted failure, a new schedule, erasure, and the purge of
finished enrollments past their retention. Finishing writes the ``followup.<status>`` event of each finished
enrollment; a released step's run (``followup_step_runs``) and its events are written in the statement that
advances or finishes its enrollment.

The caller has locked the enrollments (the release claim, or a ``SELECT ... FOR UPDATE``). Nothing here
counts metrics: callers count what they did once their transaction committed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, LiteralString, Protocol

import msgspec
from psycopg import Connection
from psycopg.rows import RowMaker
from psycopg.types.json import Jsonb

from libs.common.contracts.events import FINISHED, EnrollmentConverted, EnrollmentExited, Event
from libs.common.core.outbox import EVENTS_PART, events_params, write_events
from libs.common.core.queued import queue_write
from libs.common.core.reasons import PolicyStopReason, PolicyWaitingReason
from libs.common.core.sql import OverIds, load_queries, of_one, with_parts
from libs.common.followups.held import HeldValues
from libs.common.platform.messages import INSERT_QUEUED_MESSAGE

QUERIES = load_queries("libs.common.followups", "transitions.sql")
#: A released step's run and events written in the statement that moves its enrollment on: one statement
#: where there were three (the run, the move, the events).
ADVANCE_STEP = with_parts(QUERIES["advance"], run=QUERIES["insert_step_run"], events=EVENTS_PART)
#: A finish and its events in one statement (of most often one enrollment: a stopped contact's live one;
#: :class:`~libs.common.core.sql.OverIds`), and with the run of the step that finished it.
FINISH = OverIds.of(with_parts(QUERIES["finish"], events=EVENTS_PART))
#: A released step's finish is of its one enrollment: planned once per connection (:func:`of_one`).
FINISH_STEP = with_parts(
    of_one(QUERIES["finish"], "enrollment_id"), run=QUERIES["insert_step_run"], events=EVENTS_PART
)
#: The same two with the step's queued message written in them too (the platform's writes of it,
#: :data:`~libs.common.platform.messages.INSERT_QUEUED_MESSAGE`): a step that queues a message is one
#: statement fewer.
ADVANCE_STEP_QUEUED = with_parts(
    QUERIES["advance"], queued=INSERT_QUEUED_MESSAGE, run=QUERIES["insert_step_run"], events=EVENTS_PART
)
FINISH_STEP_QUEUED = with_parts(
    of_one(QUERIES["finish"], "enrollment_id"),
    queued=INSERT_QUEUED_MESSAGE,
    run=QUERIES["insert_step_run"],
    events=EVENTS_PART,
)

EnrollmentStatus = Literal["active", "paused", "completed", "stopped", "failed", "converted", "exited"]
FinalStatus = Literal["completed", "stopped", "failed"]
#: How an enrollment ends when one of its sequence's criteria is met: a goal converts it, an exit exits it.
CriterionStatus = Literal["converted", "exited"]
#: Why an enrollment stopped, failed or is paused (a completed or active one has none): the stop paths
#: (``stops.REASONS``: replied, human_message, opted_out, lead_closed, conversation_resolved,
#: contact_erased, undeliverable: the provider cannot deliver to the contact), a stop by hand or on
#: re-entry, the plan lost, the release's error; a pause by hand, of the sequence, or of a number without
#: a channel.
EnrollmentReason = Literal[
    "replied",
    "human_message",
    "opted_out",
    "lead_closed",
    "conversation_resolved",
    "contact_erased",
    "manual",
    "reentered",
    "plan_lost",
    "error",
    "sequence_paused",
    "instance_unavailable",
    PolicyStopReason,
]
#: Why a live enrollment waits past its due time (the release's deferrals: the sending constraints, a busy
#: conversation, a step rescheduled, an error's backoff, the provider's per-user marketing limit).
WaitingReason = Literal[
    "send_window",
    "in_flight",
    "quota",
    "backlog",
    "contact_cap",
    "instance_unavailable",
    "busy",
    "pacing",
    "rescheduled",
    "error",
    PolicyWaitingReason,
]


class Enrollment(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    version_id: uuid.UUID
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    number_id: uuid.UUID | None
    status: EnrollmentStatus
    source: str
    step_index: int
    #: When the next step is due (a paused one: when it was); null once the enrollment finished.
    next_run_at: datetime | None
    anchor_at: datetime | None
    variables: dict[str, Any]
    dedupe_key: str | None
    reason: EnrollmentReason | None
    #: Why a live enrollment is waiting past its due time (send_window, pacing, quota, ...), if it is.
    waiting_reason: WaitingReason | None
    #: What the check that holds it compared (``{"local": "09:00", "timezone": "Europe/Lisbon", ...}``:
    #: docs/api.md lists them by reason), if it is waiting and kept them.
    waiting_values: dict[str, Any] | None = None
    note: str | None
    failure_count: int
    last_error: str | None
    last_message_id: uuid.UUID | None
    enrolled_at: datetime
    finished_at: datetime | None
    #: The goal met: the enrollment converted (``converted``, or late: after it finished, inside the
    #: sequence's conversion window), when, and the step it is attributed to (the last one whose message
    #: was sent; null when none was).
    goal: str | None = None
    converted_at: datetime | None = None
    converted_step: int | None = None
    #: The exit criterion that ended it (``exited``).
    exited_by: str | None = None
    #: The arm of each experiment (split step) it reached: ``{"offer": "b"}`` (``holdout``: held out).
    assignments: dict[str, str] | None = None


_ENROLLMENT_FIELDS = frozenset(Enrollment.__struct_fields__)


def _enrollment_row(cursor: Any) -> RowMaker[Enrollment]:
    """Rows of ``followup_enrollments`` as :class:`Enrollment`: each field taken by its column's position
    (found once per result), extra columns ignored; a finished enrollment has nothing due. Built directly,
    not converted (the columns already hold the fields' types): a bulk chunk reads 500 at a time."""
    names = [column.name for column in cursor.description or []]
    positions = [(name, i) for i, name in enumerate(names) if name in _ENROLLMENT_FIELDS]

    def enrollment(values: Sequence[Any]) -> Enrollment:
        columns = {name: values[i] for name, i in positions}
        if columns["status"] not in ("active", "paused"):
            columns["next_run_at"] = None
        return Enrollment(**columns)

    return enrollment


#: Row factory for ``SELECT *`` / ``RETURNING *`` of followup_enrollments (extra columns are ignored).
ENROLLMENT_ROW = _enrollment_row


class EnrollmentRef(Protocol):
    """What a finished event names: any enrollment row (a full one, a claimed one, a stopped one)."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def sequence_id(self) -> uuid.UUID | None: ...

    @property
    def contact_id(self) -> uuid.UUID: ...


#: What a step's run did: its message queued, the step skipped (its reason says why), or a step that sends
#: nothing took a path (its reason says which).
StepOutcome = Literal["queued", "skipped", "branched"]


class StepRun(msgspec.Struct, frozen=True):
    """A released step's run (``followup_step_runs``): queued, skipped or branched, its reason as stored
    (with its detail) and, for a step held back, the values its check compared. Written by the transition
    that follows it, in its statement."""

    step_index: int
    outcome: StepOutcome
    reason: str | None
    #: When the step was due (the lag's start).
    due_at: datetime
    values: HeldValues | None = None

    def params(self, enrollment_id: uuid.UUID) -> dict[str, Any]:
        return {
            "enrollment_id": enrollment_id,
            "run_step": self.step_index,
            "outcome": self.outcome,
            "run_reason": self.reason,
            "due_at": self.due_at,
            "values": Jsonb(self.values) if self.values is not None else None,
        }


def advance(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    step_index: int,
    next_run_at: datetime,
    message_id: uuid.UUID | None,
    *,
    now: datetime,
    run: StepRun,
    events: Sequence[Event] = (),
    conversation_id: uuid.UUID | None = None,
    reply_step: int | None = None,
    message: dict[str, Any] | None = None,
) -> None:
    """Write the released step's ``run`` (its primary key refuses a second run of the step) and its
    ``events``, and move to step ``step_index``, due at ``next_run_at``, in one statement;
    ``conversation_id`` (the one the step's message went to) becomes the enrollment's when it had none;
    ``reply_step``: a wait_for_reply step's reply path, kept while the enrollment waits there
    (:func:`take_reply_path`); ``message``: the step's queued message's writes, in the same statement
    (:func:`with_message`)."""
    params = {
        "project_id": project_id,
        "id": enrollment_id,
        "step_index": step_index,
        "next_run_at": next_run_at,
        "message_id": message_id,
        "conversation_id": conversation_id,
        "reply_step": reply_step,
        "now": now,
        **run.params(enrollment_id),
        **events_params(project_id, events, occurred_at=now),
    }
    queue_write(conn, *with_message(ADVANCE_STEP, ADVANCE_STEP_QUEUED, params, message))


def with_message(
    statement: LiteralString, queued: LiteralString, params: dict[str, Any], message: dict[str, Any] | None
) -> tuple[LiteralString, dict[str, Any]]:
    """``statement`` and ``params``, or, with a queued ``message``'s writes, ``queued`` (the same with the
    message's writes in it) and the parameters of both: the names they share hold the same values (the
    message's id, its conversation, now)."""
    if message is None:
        return statement, params
    shared = message.keys() & params.keys()
    assert all(params[name] is message[name] or params[name] == message[name] for name in shared), (
        shared,
        params,
        message,
    )
    return queued, message | params


def take_reply_path(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    step_index: int,
    next_run_at: datetime,
    *,
    now: datetime,
    reply_step: int | None = None,
) -> None:
    """A reply moves an enrollment waiting for it to its reply path's step ``step_index``, due at
    ``next_run_at``; replies before ``now`` no longer stop it. ``reply_step``: that step's own reply path,
    when it is a wait for a reply too."""
    params = {
        "project_id": project_id,
        "id": enrollment_id,
        "step_index": step_index,
        "next_run_at": next_run_at,
        "reply_step": reply_step,
        "now": now,
    }
    conn.execute(QUERIES["take_reply_path"], params)


def assign(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, experiment: str, variant: str
) -> None:
    """Record the enrollment's ``variant`` (or ``holdout``) of ``experiment``."""
    params = {"project_id": project_id, "id": enrollment_id, "experiment": experiment, "variant": variant}
    conn.execute(QUERIES["assign"], params)


def defer(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    until: datetime,
    reason: str,
    *,
    unavailable_since: datetime | None = None,
    values: dict[str, Any] | None = None,
) -> None:
    """Try the same step again at ``until``; ``reason`` is what the enrollment is waiting for (one of
    :data:`WaitingReason`: the enrollment's read refuses any other), ``values`` what its check compared
    (:mod:`~libs.common.followups.held`), kept until the enrollment moves on."""
    params = {
        "project_id": project_id,
        "id": enrollment_id,
        "next_run_at": until,
        "reason": reason,
        "values": Jsonb(values) if values is not None else None,
        "unavailable_since": unavailable_since,
    }
    conn.execute(QUERIES["defer"], params)


def pause(
    conn: Connection[Any],
    project_id: uuid.UUID,
    ids: list[uuid.UUID],
    reason: EnrollmentReason,
    *,
    now: datetime,
) -> list[Enrollment]:
    """Pause the active ones of ``ids``; returns those paused."""
    params = {"project_id": project_id, "ids": ids, "reason": reason, "now": now}
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        return cur.execute(QUERIES["pause"], params).fetchall()


def resume(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID], *, now: datetime
) -> list[Enrollment]:
    """Resume the paused ones of ``ids`` (a step that fell due meanwhile is due now); returns them."""
    params = {"project_id": project_id, "ids": ids, "now": now}
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        return cur.execute(QUERIES["resume"], params).fetchall()


def finish(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollments: Sequence[EnrollmentRef],
    status: FinalStatus,
    reason: EnrollmentReason | None,
    *,
    now: datetime,
    note: str | None = None,
    step_index: int | None = None,
    message_id: uuid.UUID | None = None,
    conversation_id: uuid.UUID | None = None,
    preceding: Sequence[Event] = (),
    run: StepRun | None = None,
    message: dict[str, Any] | None = None,
) -> None:
    """Finish live enrollments with a status and reason, and write their ``followup.<status>`` events, in
    one statement.

    ``step_index``, ``message_id`` and ``conversation_id`` fold the last step's advance into a completion,
    ``run`` that step's run (one enrollment) and ``message`` its queued message's writes
    (:func:`with_message`); ``preceding`` are events of the same transaction still to be written, written
    first.
    """
    if not enrollments:
        return
    assert run is None or len(enrollments) == 1, "a step's run finishes its own enrollment"
    assert message is None or run is not None, "a step's message is written with its run"
    event = FINISHED[status]
    events = [
        event(enrollment_id=e.id, sequence_id=e.sequence_id, contact_id=e.contact_id, reason=reason)
        for e in enrollments
    ]
    params = {
        "project_id": project_id,
        "status": status,
        "reason": reason,
        "note": note,
        "step_index": step_index,
        "message_id": message_id,
        "conversation_id": conversation_id,
        "now": now,
        **events_params(project_id, [*preceding, *events], occurred_at=now),
    }
    if run is None:
        queue_write(conn, *FINISH.bound(params, [e.id for e in enrollments]))
    else:
        params |= run.params(enrollments[0].id)
        queue_write(conn, *with_message(FINISH_STEP, FINISH_STEP_QUEUED, params, message))


class Met(msgspec.Struct, frozen=True):
    """A criterion of its sequence met by an enrollment: the goal's or exit's name, and the step a conversion
    is attributed to (filled in by :func:`end_by_criterion` and :func:`convert_late`)."""

    id: uuid.UUID
    sequence_id: uuid.UUID | None
    contact_id: uuid.UUID
    name: str
    converted_step: int | None = None


def end_by_criterion(
    conn: Connection[Any],
    project_id: uuid.UUID,
    met: Sequence[Met],
    status: CriterionStatus,
    *,
    now: datetime,
) -> list[Met]:
    """End the live ones of ``met`` (locked by the caller) ``converted`` (a goal: its name in ``goal``,
    ``converted_at`` now, ``converted_step`` the last step whose message was sent) or ``exited`` (its name in
    ``exited_by``), and write their ``followup.converted`` / ``followup.exited`` events; returns those
    ended, with their step."""
    if not met:
        return []
    params = {
        "project_id": project_id,
        "ids": [m.id for m in met],
        "names": [m.name for m in met],
        "status": status,
        "now": now,
    }
    steps = dict(conn.execute(QUERIES["end_by_criterion"], params).fetchall())
    ended = [msgspec.structs.replace(m, converted_step=steps[m.id]) for m in met if m.id in steps]
    events: list[Event] = [
        EnrollmentConverted(
            enrollment_id=m.id,
            sequence_id=m.sequence_id,
            contact_id=m.contact_id,
            reason=None,
            goal=m.name,
            converted_step=m.converted_step,
        )
        if status == "converted"
        else EnrollmentExited(
            enrollment_id=m.id,
            sequence_id=m.sequence_id,
            contact_id=m.contact_id,
            reason=None,
            exited_by=m.name,
        )
        for m in ended
    ]
    write_events(conn, project_id, events, occurred_at=now)
    return ended


def convert_late(
    conn: Connection[Any], project_id: uuid.UUID, met: Sequence[Met], *, now: datetime
) -> list[Met]:
    """A late conversion: the finished ones of ``met`` not converted yet (locked by the caller) get the goal,
    ``converted_at`` and ``converted_step``, their status kept, and a ``followup.converted`` event (``late``);
    returns those converted (never one twice)."""
    if not met:
        return []
    params = {
        "project_id": project_id,
        "ids": [m.id for m in met],
        "names": [m.name for m in met],
        "now": now,
    }
    steps = dict(conn.execute(QUERIES["convert_late"], params).fetchall())
    converted = [msgspec.structs.replace(m, converted_step=steps[m.id]) for m in met if m.id in steps]
    events = [
        EnrollmentConverted(
            enrollment_id=m.id,
            sequence_id=m.sequence_id,
            contact_id=m.contact_id,
            reason=None,
            goal=m.name,
            converted_step=m.converted_step,
            late=True,
        )
        for m in converted
    ]
    write_events(conn, project_id, events, occurred_at=now)
    return converted


def lease(conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, until: datetime) -> int:
    """Lease an AI step until ``until``; returns the fence (the attempts count now)."""
    params = {"project_id": project_id, "id": enrollment_id, "until": until}
    row = conn.execute(QUERIES["lease"], params).fetchone()
    assert row is not None
    fence: int = row[0]
    return fence


def count_failure(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, error: str
) -> int | None:
    """Count an unexpected failure; the consecutive count, or None when the enrollment is no longer active."""
    params = {"project_id": project_id, "id": enrollment_id, "error": error}
    row = conn.execute(QUERIES["count_failure"], params).fetchone()
    return int(row[0]) if row is not None else None


def update_schedule(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    *,
    anchor_at: datetime | None,
    next_run_at: datetime,
    variables: dict[str, Any],
    now: datetime,
) -> Enrollment | None:
    """A live enrollment's new anchor, due time and variables (None when it is no longer live)."""
    params = {
        "project_id": project_id,
        "id": enrollment_id,
        "anchor_at": anchor_at,
        "next_run_at": next_run_at,
        "variables": Jsonb(variables),
        "now": now,
    }
    with conn.cursor(row_factory=ENROLLMENT_ROW) as cur:
        return cur.execute(QUERIES["update_schedule"], params).fetchone()


def anonymise(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, now: datetime) -> None:
    """Privacy erasure: the contact's enrollments keep nothing that could identify the person."""
    conn.execute(QUERIES["anonymise"], {"project_id": project_id, "contact_id": contact_id, "now": now})


def purge_finished(conn: Connection[Any], project_id: uuid.UUID, *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` of the project's finished enrollments older than its ``retention_days``
    (default 90), oldest first, with their step runs; returns how many went (the retention job calls it a
    batch per transaction, project by project)."""
    params = {"project_id": project_id, "now": now, "limit": limit}
    return conn.execute(QUERIES["finished_enrollments"], params).rowcount


def recount_live(conn: Connection[Any], project_id: uuid.UUID) -> tuple[int, int]:
    """Count the project's live enrollments anew and make its live count say so (the retention job's
    reconciliation, a transaction of its own per project): returns the count and what the counter said
    (their difference is the drift corrected). The counter's shards are locked first, so the project's
    enrollments and finishes wait for the count (one index walk over its live enrollments). A shard held by
    another transaction (a bulk chunk, say) is waited for at most 200 ms: then
    :class:`psycopg.errors.LockNotAvailable` is raised, so the shards already locked are not held behind it
    while the project's releases wait for them."""
    params = {"project_id": project_id}
    conn.execute("SET LOCAL lock_timeout = '200ms'")
    conn.execute(QUERIES["lock_live_counters"], params)
    conn.execute("SET LOCAL lock_timeout = 0")
    row = conn.execute(QUERIES["recount_live"], params).fetchone()
    assert row is not None
    return row[0], row[1]
