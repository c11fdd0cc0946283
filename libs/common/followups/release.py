"""The release of due enrollments: claim a project's oldest (:mod:`~libs.common.followups.release_claim`),
release its step (:mod:`~libs.common.followups.release_step`), commit, then count what happened
(:class:`Tally`), one transaction a step. The release service's batch runs its steps as a :class:`Chain`
(each COMMIT sent with the next step's claim, or the next walk of the projects with due enrollments);
:func:`release_one` releases one step; the loop sleeps :func:`seconds_until_next_due` when nothing is
due."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack, suppress
from datetime import datetime, timedelta
from typing import Any, TypeVar

import msgspec
from prometheus_client.metrics import MetricWrapperBase
from psycopg import Connection
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.db import buffered_pipeline, roll_back, server_unavailable
from libs.common.core.jobs import FIRST_PROJECT
from libs.common.core.metrics import FOLLOWUP_FINISHED, FOLLOWUP_RELEASE_LAG, FOLLOWUP_STEPS, labelled
from libs.common.core.queued import Queued, queue_command
from libs.common.core.settings import FollowupSettings
from libs.common.followups.release_claim import due_projects as _due_projects
from libs.common.followups.release_claim import seconds_until_due
from libs.common.followups.release_state import claim_release
from libs.common.followups.release_step import Released, record_failure, release_claimed

R = TypeVar("R")


def release_one(
    pool: ConnectionPool,
    clock: Clock,
    settings: FollowupSettings,
    ai_lease: timedelta | None = None,
    *,
    project_id: uuid.UUID | None = None,
) -> Released | None:
    """Release the project's oldest due enrollment, if any; returns what happened, or None when none is due.
    Without ``project_id``, of the first project with a due enrollment (in id order; a read without locks
    first).

    ``ai_lease`` (a model is configured): an AI step is leased for that long and returned as ``lease``; the
    caller sends it to the ai_steps service once committed."""
    with pool.connection() as conn:
        return release_on(conn, clock, settings, ai_lease, project_id=project_id)


def release_on(
    conn: Connection[Any],
    clock: Clock,
    settings: FollowupSettings,
    ai_lease: timedelta | None = None,
    *,
    project_id: uuid.UUID | None = None,
) -> Released | None:
    """:func:`release_one` on a connection the caller holds (idle): one step, in a transaction of its own,
    committed here (and counted: :class:`Tally`)."""
    if project_id is None:
        first = due_projects(conn, clock, after=FIRST_PROJECT, projects=1)
        if not first:
            return None
        project_id = first[0]
    with Chain(conn, clock, settings, ai_lease) as chain:
        if chain.release(project_id) is None:
            return None
    (released,) = chain.take_committed()
    return released


class _Pending(msgspec.Struct, frozen=True):
    """A released step whose COMMIT is sent, not yet read back."""

    released: Released
    commit: Queued | None
    project_id: uuid.UUID
    now: datetime


class Chain:
    """Steps released on one connection (the release loop's batch), each in a transaction of its own, each
    COMMIT sent with the next step's ``BEGIN`` and claim: a step costs one round trip, where a transaction
    alone costs two (its read, then its writes with its COMMIT). Every step is still one transaction,
    committed synchronously, with the same statements and locks; a step is counted (:class:`Tally`, added
    to the metrics at the chain's end) and handed back (:meth:`take_committed`) once its COMMIT is read
    back.

    A step whose COMMIT fails (or whose writes did: the COMMIT then reads nothing) is found at the next
    read; the statements sent after it in the same round trip did not run (PostgreSQL skips them once one
    fails). Its failure is recorded (:func:`~libs.common.followups.release_step.record_failure`: backed off,
    or failed after FOLLOWUP_MAX_FAILURES), and the next step is claimed again. A step that fails before its
    COMMIT rolls back alone. The database gone: raised (nothing is counted against a step), the connection
    closed. Used as a context manager: its end reads back the last COMMIT."""

    def __init__(
        self, conn: Connection[Any], clock: Clock, settings: FollowupSettings, ai_lease: timedelta | None
    ) -> None:
        self.conn, self.clock, self.settings, self.ai_lease = conn, clock, settings, ai_lease
        self._pipeline: ExitStack | None = None
        self._autocommit = conn.autocommit
        self._pending: _Pending | None = None
        self._committed: list[Released] = []
        self._tally = Tally()

    def __enter__(self) -> Chain:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self._settle()
            else:
                self._abort()
        finally:
            self._tally.flush()
        if not self.conn.closed and self.conn.info.transaction_status == TransactionStatus.IDLE:
            self.conn.autocommit = self._autocommit

    def take_committed(self) -> list[Released]:
        """The steps committed (or their failures recorded) since the last call, in order."""
        taken, self._committed = self._committed, []
        return taken

    def release(self, project_id: uuid.UUID) -> Released | None:
        """Claim the project's oldest due enrollment and release its step, its COMMIT sent with the next
        claim (or at the end); None when none is due. What it did is returned before it is committed: the
        caller counts it once :meth:`take_committed` hands it back."""
        now = self.clock.now()
        # the claim and the contact's state
        found = self._begin_and_read(lambda: claim_release(self.conn, project_id, now))
        if found is None:
            queue_command(self.conn, "COMMIT")
            return None
        row, read = found
        try:
            released = release_claimed(
                self.conn, row, self.settings, now=now, ai_lease=self.ai_lease, read=read
            )
        except Exception as exc:
            self._abort()
            self._failed(row.project_id, row.id, now, exc)
            return self._committed[-1]
        self._pending = _Pending(released, queue_command(self.conn, "COMMIT"), row.project_id, now)
        return released

    def due_projects(self, *, after: uuid.UUID, projects: int) -> list[uuid.UUID]:
        """The projects with a due enrollment, in turns from ``after`` (at most ``projects``): read in a
        transaction of its own, sent with the last step's COMMIT."""
        now = self.clock.now()
        due = self._begin_and_read(lambda: _due_projects(self.conn, now, after=after, projects=projects))
        queue_command(self.conn, "COMMIT")
        return due

    def _begin_and_read(self, read: Callable[[], R]) -> R:
        """A transaction's ``BEGIN`` and its first ``read``, sent with the COMMIT before them, whose step is
        then counted, or, when that COMMIT did not go through, whose failure is recorded (the read, which
        did not run, is made again)."""
        self._open()
        queue_command(self.conn, "BEGIN")
        try:
            result = read()
        except Exception as exc:
            pending, self._pending = self._pending, None
            self._abort()
            if pending is None or _committed(pending):
                if pending is not None:
                    self._commit(pending.released)
                raise  # the read's own failure (the database gone: the loop tries again)
            self._failed_pending(pending, exc)  # the step before did not commit: this read never ran
            return self._begin_and_read(read)
        if self._pending is not None:
            self._commit(self._pending.released)
            self._pending = None
        return result

    def _open(self) -> None:
        if self._pipeline is None:
            self.conn.autocommit = True  # psycopg then starts nothing itself: BEGIN and COMMIT are ours
            stack = ExitStack()
            stack.enter_context(buffered_pipeline(self.conn))
            self._pipeline = stack

    def _settle(self) -> None:
        """The pipeline's end: the last COMMIT read back."""
        pending, self._pending = self._pending, None
        try:
            if self._pipeline is not None:
                stack, self._pipeline = self._pipeline, None
                stack.close()
        except Exception as exc:
            self._abort()
            if pending is None or _committed(pending):
                raise
            self._failed_pending(pending, exc)
            return
        if pending is not None:
            self._commit(pending.released)

    def _abort(self) -> None:
        """Leave the pipeline (what it still held is read and dropped) and roll back; a connection whose
        state cannot be restored is closed (the pool drops it)."""
        if self._pipeline is not None:
            stack, self._pipeline = self._pipeline, None
            with suppress(Exception):  # the failure being handled is raised or recorded already
                stack.close()
        roll_back(self.conn)

    def _failed_pending(self, pending: _Pending, exc: Exception) -> None:
        """The step whose COMMIT was sent did not commit: :meth:`_failed`."""
        self._failed(pending.project_id, pending.released.enrollment_id, pending.now, exc)

    def _failed(self, project_id: uuid.UUID, enrollment_id: uuid.UUID, now: datetime, exc: Exception) -> None:
        """A step that did not commit: its failure recorded (or, the database gone, raised)."""
        if self.conn.closed or server_unavailable(exc):
            raise exc
        self._commit(record_failure(self.conn, project_id, enrollment_id, exc, now, self.settings))

    def _commit(self, released: Released) -> None:
        self._tally.observe(released)
        self._committed.append(released)


def _committed(pending: _Pending) -> bool:
    """Whether the step's COMMIT was read back done (not skipped after a failure, nor rolled back)."""
    return pending.commit is not None and pending.commit.went_through(b"COMMIT")


def due_projects(conn: Connection[Any], clock: Clock, *, after: uuid.UUID, projects: int) -> list[uuid.UUID]:
    """The projects with a due enrollment, in turns from ``after`` (at most ``projects``), read in a
    transaction of its own on ``conn`` (idle)."""
    with conn.transaction():
        return _due_projects(conn, clock.now(), after=after, projects=projects)


def seconds_until_next_due(pool: ConnectionPool, clock: Clock) -> float | None:
    """Seconds until the next active enrollment falls due (None: none is waiting); the loop's ``next_due``."""
    with pool.connection() as conn:
        return seconds_until_due(conn, clock.now())


class Tally:
    """Committed releases counted: the one place ``whatstig_followup_steps_total``, the release lag and the
    finished counter are incremented from the release path. The counters' increments are kept here and
    added at :meth:`flush` (a chain's steps count into the same few children: one increment each at the
    chain's end, not a locked one per step); the lag is observed at once."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[MetricWrapperBase, str, str]] = Counter()

    def observe(self, released: Released) -> None:
        """Count a committed release."""
        if released.action in ("retry", "fail"):
            outcome = "error"
        elif released.action == "queue":
            outcome = _category(released.reason) if released.reason else "sent"
        else:
            outcome = _category(released.reason or "none")
        counts = self._counts
        counts[FOLLOWUP_STEPS, released.action, outcome] += 1
        if released.lag_seconds is not None:
            FOLLOWUP_RELEASE_LAG.observe(released.lag_seconds)
        if released.finished == "stopped":
            counts[FOLLOWUP_FINISHED, "stopped", released.reason or "none"] += 1
        elif released.finished is not None:
            reason = "error" if released.finished == "failed" else "none"
            counts[FOLLOWUP_FINISHED, released.finished, reason] += 1

    def flush(self) -> None:
        """What was counted since the last flush, added to the metrics."""
        counts, self._counts = self._counts, Counter()
        for (metric, *values), count in counts.items():
            labelled(metric, *values).inc(count)


def observe(released: Released) -> None:
    """Count one committed release (outside a chain: the AI step's second pass)."""
    tally = Tally()
    tally.observe(released)
    tally.flush()


def _category(reason: str) -> str:
    """A reason's bounded category for metric labels (``missing_variable:vars.x`` -> ``missing_variable``)."""
    return reason.split(":", 1)[0]
