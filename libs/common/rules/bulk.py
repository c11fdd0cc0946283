"""Bulk enrollment: a resumable job that enrolls a list of contacts, or the contacts a segment matched,
in a sequence.

**The contacts are fixed when the job is created.** A list (contact ids and/or phones, up to 100,000) is
copied into ``followup_bulk_job_items`` row by row; a segment (a condition tree in the rules syntax, about
contacts only) is evaluated once, in SQL, and the contacts it matched then are the job's, in order: a
contact who matches later is not swept in, and one who stops matching is still enrolled (``enroll()``
refuses the opted-out and the already enrolled, as for any enrollment).

**Processing** (the triggers service's ``bulk`` loop, :func:`process_chunk`): one chunk per transaction.
The job's row is locked ``FOR UPDATE SKIP LOCKED`` for the chunk (one worker at a time moves a job on);
the chunk's contacts are enrolled together by ``enroll_all()`` (a few statements for the chunk, every rule
of ``enroll()`` applied to each contact in list order: a refusal is an outcome, ``skipped`` with its
reason, the same as ``enroll()`` one by one would give); their outcomes, the cursor and the counts are
written in the same transaction. Should PostgreSQL refuse a value of one contact (out of its range), the
chunk's contacts are enrolled again each in a savepoint, that contact skipped ``error``. A worker killed at
any moment loses only its uncommitted chunk, which the next worker redoes: no contact is enrolled twice
and none is skipped. A cancel takes effect at the next chunk.

Events: ``bulk_job.progress`` (at most one a second per job) and ``bulk_job.completed``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, Final, Literal, get_args

import msgspec
import psycopg
from psycopg import Connection, sql
from psycopg.rows import dict_row, kwargs_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.contracts.events import BulkJobCompleted, BulkJobProgress
from libs.common.contracts.limits import Phone, Variables
from libs.common.core import validation
from libs.common.core.clock import Clock
from libs.common.core.effects import NudgeTriggers, after_commit, committed
from libs.common.core.errors import FollowupsError, InvalidInput, NotFound
from libs.common.core.jobs import savepoint
from libs.common.core.outbox import write_events
from libs.common.core.reasons import Other, split
from libs.common.core.runtime import Runtime
from libs.common.core.sql import load_queries
from libs.common.followups.enrollments import (
    EnrollmentRejected,
    EnrollmentRejection,
    EnrollRequest,
    EnrollResult,
    ExitCriteriaMet,
    enroll_all,
)
from libs.common.followups.sequences import get_sequence
from libs.common.platform.conditions import SEGMENT_CONTEXT, compile_conditions, parse_segment

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.rules", "bulk.sql")

#: Most contacts one job may list.
MAX_CONTACTS = 100_000
#: Contacts enrolled per transaction.
CHUNK = 500
#: A segment's contacts as a job's contacts: the segment's context and predicate are composed in, then the
#: job's id, the project and the predicate's values bound.
SEGMENT_ITEMS = sql.SQL(
    "INSERT INTO followup_bulk_job_items (project_id, job_id, position, contact_id)"
    " SELECT c.project_id, %s, row_number() OVER (ORDER BY c.id), c.id FROM {}"
    " WHERE c.project_id = %s AND c.erased_at IS NULL AND {}"
)
#: Least time between two progress events of a job.
PROGRESS_EVERY = timedelta(seconds=1)

BulkStatus = Literal["queued", "running", "completed", "cancelled", "failed"]
#: Why a job skipped a contact (its item's ``reason``, the keys of ``skipped``): ``enroll()`` refused it, no
#: such contact (``unknown_contact``), a malformed phone (``invalid_phone``), no anchor in its attribute
#: (``missing_anchor``), a value ``enroll()`` refuses (``invalid``), or an error of its own data (``error``).
BulkSkipReason = Literal[
    EnrollmentRejection, "unknown_contact", "invalid_phone", "missing_anchor", "invalid", "error"
]
#: The skip reasons this version writes (a stored one it does not know is counted as ``other``).
BULK_SKIP_REASONS: Final[frozenset[BulkSkipReason]] = frozenset(get_args(BulkSkipReason))


class BulkCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Enroll contacts in a sequence: listed (``contact_ids`` and/or ``phones``) or a ``segment``."""

    sequence_id: uuid.UUID
    contact_ids: list[uuid.UUID] | None = None
    phones: list[Phone] | None = None
    #: A condition tree about contacts (the rules syntax, without event attributes), frozen at creation.
    segment: dict[str, Any] | None = None
    #: Template variables shared by every enrollment of the job.
    variables: Variables = msgspec.field(default_factory=dict)
    #: The anchor of every enrollment ...
    anchor_at: datetime | None = None
    #: ... or each contact's own, from a custom attribute holding an ISO 8601 time.
    anchor_attribute: str | None = None


class BulkJob(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID
    status: BulkStatus
    total: int
    processed: int
    enrolled: int
    #: Skipped contacts by reason (already_enrolled, opted_out, plan_limit, unknown_contact, invalid_phone,
    #: ...; ``other``: the reasons this version does not know).
    skipped: dict[Literal[BulkSkipReason, Other], int]
    segment: dict[str, Any] | None
    variables: dict[str, Any]
    anchor_at: datetime | None
    anchor_attribute: str | None
    cancel_requested: bool
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


def create_job(
    conn: Connection[Any],
    project_id: uuid.UUID,
    data: BulkCreate,
    *,
    idempotency_key: str | None = None,
    now: datetime,
) -> tuple[BulkJob, bool]:
    """Create a job with its contacts fixed; returns it and whether it was created (a repeated
    ``idempotency_key`` returns the job it created before)."""
    if idempotency_key is not None:
        if not 1 <= len(validation.text(idempotency_key, "Idempotency-Key")) <= 200:
            raise InvalidInput("Idempotency-Key has 1 to 200 characters", field="Idempotency-Key")
        found = conn.execute(
            QUERIES["by_idempotency_key"], {"project_id": project_id, "key": idempotency_key}
        ).fetchone()
        if found is not None:
            return get_job(conn, project_id, found[0]), False
    listed = len(data.contact_ids or []) + len(data.phones or [])
    if (data.segment is None) == (data.contact_ids is None and data.phones is None):
        raise InvalidInput("give either contacts (contact_ids, phones) or a segment", field="segment")
    if data.segment is None and not 1 <= listed <= MAX_CONTACTS:
        raise InvalidInput(f"a job lists 1 to {MAX_CONTACTS} contacts", field="contact_ids")
    segment = parse_segment(data.segment) if data.segment is not None else None
    try:
        sequence = get_sequence(conn, project_id, data.sequence_id)
    except NotFound:
        raise NotFound("sequence not found", field="sequence_id") from None
    if sequence.current_version_id is None or sequence.status != "active":
        raise InvalidInput("the sequence must be published and active", field="sequence_id")
    if data.anchor_at is not None and data.anchor_at.tzinfo is None:
        raise InvalidInput("anchor_at needs a time zone offset", field="anchor_at")
    if data.anchor_attribute is not None:
        if data.anchor_at is not None:
            raise InvalidInput("give anchor_at or anchor_attribute, not both", field="anchor_attribute")
        key = data.anchor_attribute.removeprefix("contact.attributes.")
        if (
            not data.anchor_attribute.startswith("contact.attributes.")
            or not 1 <= len(key) <= 64
            or "\x00" in key
        ):
            raise InvalidInput(
                "anchor_attribute is contact.attributes.<key> (a key of 1 to 64 characters)",
                field="anchor_attribute",
            )
    validation.keyed(data.variables, "variables")
    params = {
        "project_id": project_id,
        "sequence_id": data.sequence_id,
        "segment": Jsonb(data.segment) if data.segment is not None else None,
        "variables": Jsonb(data.variables),
        "anchor_at": data.anchor_at,
        "anchor_attribute": data.anchor_attribute,
        "idempotency_key": idempotency_key,
        "now": now,
    }
    row = conn.execute(QUERIES["insert_job"], params).fetchone()
    if row is None:  # a concurrent create with the same Idempotency-Key committed first: its job
        found = conn.execute(
            QUERIES["by_idempotency_key"], {"project_id": project_id, "key": idempotency_key}
        ).fetchone()
        assert found is not None
        return get_job(conn, project_id, found[0]), False
    job_id: uuid.UUID = row[0]
    if segment is not None:
        predicate, values = compile_conditions(segment)
        query = SEGMENT_ITEMS.format(SEGMENT_CONTEXT, predicate)
        conn.execute(query, [job_id, project_id, *values])
    else:
        with conn.cursor().copy(
            "COPY followup_bulk_job_items (project_id, job_id, position, contact_id, phone) FROM STDIN"
        ) as copy:
            position = 0
            for contact_id in data.contact_ids or []:
                position += 1
                copy.write_row((project_id, job_id, position, contact_id, None))
            for phone in data.phones or []:
                position += 1
                # kept as given (cut to 64): a malformed one is skipped invalid_phone when its turn comes
                copy.write_row((project_id, job_id, position, None, phone.replace("\x00", "\ufffd")[:64]))
    conn.execute(QUERIES["set_total"], {"project_id": project_id, "id": job_id})
    job = get_job(conn, project_id, job_id)
    log.info(
        "bulk job created", extra={"project_id": str(project_id), "job_id": str(job_id), "total": job.total}
    )
    after_commit(conn, NudgeTriggers(project_id))  # the triggers service's bulk loop takes it at once
    return job, True


def _job(*, skipped: dict[str, int], **columns: Any) -> BulkJob:
    """A job from its row, its skipped contacts counted by the reasons this version knows."""
    counts: dict[BulkSkipReason | Other, int] = {}
    for code, count in skipped.items():
        reason, _ = split(code, BULK_SKIP_REASONS)
        assert reason is not None
        counts[reason] = counts.get(reason, 0) + count
    return BulkJob(skipped=counts, **columns)


#: Row factory of a job's columns (get_job, list_jobs).
JOB_ROW = kwargs_row(_job)


def get_job(conn: Connection[Any], project_id: uuid.UUID, job_id: uuid.UUID) -> BulkJob:
    with conn.cursor(row_factory=JOB_ROW) as cur:
        job = cur.execute(QUERIES["get_job"], {"project_id": project_id, "id": job_id}).fetchone()
    if job is None:
        raise NotFound("bulk enrollment not found", field="job_id")
    return job


def list_jobs(
    conn: Connection[Any], project_id: uuid.UUID, *, limit: int, after: uuid.UUID | None = None
) -> list[BulkJob]:
    with conn.cursor(row_factory=JOB_ROW) as cur:
        return cur.execute(
            QUERIES["list_jobs"], {"project_id": project_id, "limit": limit, "after": after}
        ).fetchall()


def cancel_job(conn: Connection[Any], project_id: uuid.UUID, job_id: uuid.UUID, *, now: datetime) -> BulkJob:
    """Ask the job to stop at its next chunk (a finished job is returned as it is)."""
    conn.execute(QUERIES["request_cancel"], {"project_id": project_id, "id": job_id, "now": now})
    after_commit(conn, NudgeTriggers(project_id))
    return get_job(conn, project_id, job_id)


#: The columns of :func:`skipped_rows`, the skipped CSV's header.
SKIPPED_HEADER: Final = ("position", "contact_id", "phone", "reason")


def skipped_rows(
    conn: Connection[Any], project_id: uuid.UUID, job_id: uuid.UUID
) -> Iterator[tuple[Any, ...]]:
    """The contacts the job skipped, with the reason (position, contact_id, phone, reason), in order."""
    get_job(conn, project_id, job_id)
    with conn.cursor(name=f"skipped_{job_id.hex}") as cur:  # server-side: a long list is streamed
        cur.execute(QUERIES["skipped_items"], {"project_id": project_id, "job_id": job_id})
        yield from cur


def item_outcomes(conn: Connection[Any], project_id: uuid.UUID, job_id: uuid.UUID) -> list[tuple[Any, ...]]:
    """Each listed contact's (position, contact_id, phone, outcome, reason), in order: ``enrolled``,
    ``skipped`` with the reason, or None while the job has not reached it."""
    return conn.execute(QUERIES["item_outcomes"], {"project_id": project_id, "job_id": job_id}).fetchall()


# --- processing -----------------------------------------------------------------------------------------


def process_chunk(
    pool: ConnectionPool, clock: Clock, *, chunk: int = CHUNK, runtime: Runtime | None = None
) -> int:
    """Move the oldest unfinished job on by one chunk; returns how many contacts it handled. A job that only
    finishes (its last chunk was full, it was cancelled, it had nobody) does not end the call: the next job
    is moved on, so 0 means there was nothing to do (or every unfinished job is held by another worker).
    The chunk's after-commit effects (one release nudge per project for the enrollments due now) run with
    ``runtime`` once it committed (without one, they are dropped)."""
    while True:
        handled, moved = _one_chunk(pool, clock, chunk, runtime)
        if handled or not moved:
            return handled


def _one_chunk(pool: ConnectionPool, clock: Clock, chunk: int, runtime: Runtime | None) -> tuple[int, bool]:
    """One chunk of the oldest unfinished job: (contacts handled, whether a job was there to move on)."""
    now = clock.now()
    with committed(pool, runtime) as conn:
        job = _lock_next_job(conn)
        if job is None:
            return 0, False
        context = {"job_id": str(job["id"]), "project_id": str(job["project_id"])}
        if job["cancel_requested"]:
            _advance(conn, job, job["cursor"], [], "cancelled", now)
            log.info("bulk job cancelled", extra=context | {"processed": job["processed"]})
            return 0, True
        items = conn.execute(
            QUERIES["next_items"],
            {"project_id": job["project_id"], "job_id": job["id"], "cursor": job["cursor"], "limit": chunk},
        ).fetchall()
        outcomes = _enroll_chunk(conn, job, items, now)
        status = "running" if len(items) == chunk else "completed"
        _advance(conn, job, items[-1][0] if items else job["cursor"], outcomes, status, now)
        log.info(
            "bulk job chunk" if status == "running" else "bulk job completed",
            extra=context | {"contacts": len(items), "processed": job["processed"] + len(items)},
        )
    return len(items), True


#: Jobs read in turn order for one chunk: the first no other worker holds is the one moved on.
CANDIDATES = 16


def _lock_next_job(conn: Connection[Any]) -> dict[str, Any] | None:
    """The next unfinished job in turns across projects that no other worker holds, locked for the chunk
    (the candidates are read across projects without locks, then each locked by its project and id)."""
    candidates = conn.execute(QUERIES["next_jobs"], {"candidates": CANDIDATES}).fetchall()
    with conn.cursor(row_factory=dict_row) as cur:
        for project_id, job_id in candidates:
            job = cur.execute(QUERIES["lock_job"], {"project_id": project_id, "id": job_id}).fetchone()
            if job is not None:
                return job
    return None


def _enroll_chunk(
    conn: Connection[Any], job: dict[str, Any], items: list[tuple[Any, ...]], now: datetime
) -> list[dict[str, Any]]:
    """Enroll the chunk's contacts in a few statements (:func:`enroll_all`); returns each one's outcome, in
    order. Those that cannot be enrolled (a malformed phone, an unknown contact, a missing anchor) are
    skipped with the reason first."""
    project_id = job["project_id"]
    phones: dict[str, str | None] = {}
    for _, _, phone in items:
        if phone is not None:
            try:
                phones[phone] = validation.phone(phone)
            except InvalidInput:
                phones[phone] = None
    by_phone = (
        dict(
            conn.execute(
                QUERIES["contacts_by_phone"],
                {"project_id": project_id, "phones": [p for p in phones.values() if p is not None]},
            ).fetchall()
        )
        if phones
        else {}
    )
    anchors: dict[uuid.UUID, Any] = {}
    key = (job["anchor_attribute"] or "").removeprefix("contact.attributes.")
    if key:
        ids = [c for _, c, _ in items if c is not None] + list(by_phone.values())
        anchors = dict(conn.execute(QUERIES["anchors"], {"project_id": project_id, "key": key, "ids": ids}))
    outcomes: list[dict[str, Any]] = []
    chosen: list[tuple[int, EnrollRequest]] = []
    for position, contact_id, phone in items:
        if phone is not None:
            normalized = phones[phone]
            if normalized is None:
                outcomes.append(_outcome(position, "invalid_phone"))
                continue
            contact_id = by_phone.get(normalized)
        if contact_id is None:
            outcomes.append(_outcome(position, "unknown_contact"))
            continue
        anchor_at = job["anchor_at"]
        if key:
            anchor_at = _anchor(anchors.get(contact_id))
            if anchor_at is None:
                outcomes.append(_outcome(position, "missing_anchor"))
                continue
        request = EnrollRequest(
            contact_id=contact_id,
            sequence_id=job["sequence_id"],
            variables=job["variables"],
            anchor_at=anchor_at,
        )
        chosen.append((position, request))
    for (position, request), result in zip(
        chosen, _enroll_all(conn, job, [r for _, r in chosen], now), strict=True
    ):
        outcomes.append(_outcome(position, _skip_reason(job, request, result)))
    return sorted(outcomes, key=lambda outcome: int(outcome["position"]))


def _enroll_all(
    conn: Connection[Any], job: dict[str, Any], requests: list[EnrollRequest], now: datetime
) -> list[EnrollResult | psycopg.DataError]:
    """The requests enrolled together in a savepoint; should a statement refuse the data of one of them (a
    value out of PostgreSQL's range), each again in a savepoint of its own, so that the contact's error is
    its outcome and does not wedge the job."""
    try:
        with savepoint(conn):
            return list(enroll_all(conn, job["project_id"], requests, now=now, source="bulk", brief=True))
    except psycopg.DataError:
        pass
    results: list[EnrollResult | psycopg.DataError] = []
    for request in requests:
        try:
            with savepoint(conn):
                results += enroll_all(conn, job["project_id"], [request], now=now, source="bulk", brief=True)
        except psycopg.DataError as error:
            results.append(error)
    return results


def _skip_reason(
    job: dict[str, Any], request: EnrollRequest, result: EnrollResult | psycopg.DataError
) -> str | None:
    """Why a contact was skipped (None: enrolled): ``enroll()``'s refusal (an exit criterion's with its name:
    ``exit_criteria:<name>``), or an error of its own data."""
    if isinstance(result, tuple):
        return None
    if isinstance(result, ExitCriteriaMet):
        return f"{result.code}:{result.detail}"
    if isinstance(result, EnrollmentRejected):
        return result.code
    if isinstance(result, NotFound):  # the contact was deleted since the job was created
        return "unknown_contact"
    if isinstance(result, FollowupsError):  # a value enroll() refuses (InvalidInput)
        return "invalid"
    log.warning(
        "bulk job contact failed",
        extra={"job_id": str(job["id"]), "contact_id": str(request.contact_id), "error": repr(result)},
    )
    return "error"


def _outcome(position: int, reason: str | None) -> dict[str, Any]:
    return {"position": position, "outcome": "enrolled" if reason is None else "skipped", "reason": reason}


def _anchor(raw: Any) -> datetime | None:
    try:
        value = datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    return value if value is not None and value.tzinfo is not None else None


def _advance(
    conn: Connection[Any],
    job: dict[str, Any],
    cursor: int,
    outcomes: list[dict[str, Any]],
    status: str,
    now: datetime,
) -> None:
    """Write the chunk's outcomes and move the job on, with its progress (or completed) event."""
    skips = [o for o in outcomes if o["outcome"] == "skipped"]
    if skips:
        params = {"project_id": job["project_id"], "job_id": job["id"], "items": Jsonb(skips)}
        conn.execute(QUERIES["record_items"], params)
    skipped = dict(job["skipped"])
    for outcome in outcomes:
        if outcome["outcome"] == "skipped":
            skipped[outcome["reason"]] = skipped.get(outcome["reason"], 0) + 1
    enrolled = job["enrolled"] + sum(1 for o in outcomes if o["outcome"] == "enrolled")
    processed = job["processed"] + len(outcomes)
    progress_at = job["progress_at"]
    events: list[BulkJobProgress | BulkJobCompleted] = []
    counts = {"processed": processed, "total": job["total"], "enrolled": enrolled, "skipped": skipped}
    if status in ("completed", "cancelled"):
        events.append(BulkJobCompleted(job_id=job["id"], status=status, **counts))
    elif progress_at is None or now - progress_at >= PROGRESS_EVERY:
        events.append(BulkJobProgress(job_id=job["id"], **counts))
        progress_at = now
    conn.execute(
        QUERIES["advance"],
        {
            "project_id": job["project_id"],
            "id": job["id"],
            "cursor": cursor,
            "processed": processed,
            "enrolled": enrolled,
            "skipped": Jsonb(skipped),
            "skipped_count": sum(skipped.values()),
            "status": status,
            "progress_at": progress_at,
            "now": now,
        },
    )
    write_events(conn, job["project_id"], events, occurred_at=now)
