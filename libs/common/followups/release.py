"""The release of one due enrollment: claim a project's oldest (:mod:`~libs.common.followups.release_claim`),
release its step (:mod:`~libs.common.followups.release_step`), commit, then count what happened
(:func:`observe`). The release service's loop walks the projects with due enrollments in turns
(:func:`due_projects`) and calls :func:`release_one` for each, until nothing is due, then sleeps
:func:`seconds_until_next_due`."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.db import pipelined_transaction, server_unavailable
from libs.common.core.jobs import FIRST_PROJECT
from libs.common.core.metrics import FOLLOWUP_FINISHED, FOLLOWUP_RELEASE_LAG, FOLLOWUP_STEPS, labelled
from libs.common.core.settings import FollowupSettings
from libs.common.followups.release_claim import due_projects as _due_projects
from libs.common.followups.release_claim import seconds_until_due
from libs.common.followups.release_state import claim_release
from libs.common.followups.release_step import Released, record_failure, release_claimed


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
    """:func:`release_one` on a connection the caller holds (idle): a burst of claims keeps one connection
    (the release loop's batch) instead of a checkout each. Its own transaction, committed here."""
    now = clock.now()
    claimed: tuple[uuid.UUID, uuid.UUID] | None = None  # (project, enrollment)
    try:
        # one pipeline: a statement whose result is read waits for it; BEGIN travels with the claim, and
        # the writes that follow the last read travel together with the COMMIT in one round trip
        with pipelined_transaction(conn):
            if project_id is None:
                first = _due_projects(conn, now, after=FIRST_PROJECT, projects=1)
                if not first:
                    return None
                project_id = first[0]
            found = claim_release(conn, project_id, now)  # the claim and the contact's state
            if found is None:
                return None
            row, read = found
            claimed = (row.project_id, row.id)
            released = release_claimed(conn, row, settings, now=now, ai_lease=ai_lease, read=read)
    except Exception as exc:
        # the database went away mid-release: not the enrollment's fault (no failure counted, no back-off);
        # the transaction is gone with the connection, and the loop tries again once the server is back
        if claimed is None or server_unavailable(exc):
            raise
        released = record_failure(conn, *claimed, exc, now, settings)
    observe(released)
    return released


def due_projects(conn: Connection[Any], clock: Clock, *, after: uuid.UUID, projects: int) -> list[uuid.UUID]:
    """The projects with a due enrollment, in turns from ``after`` (at most ``projects``), read in a
    transaction of its own on ``conn`` (idle)."""
    with conn.transaction():
        return _due_projects(conn, clock.now(), after=after, projects=projects)


def seconds_until_next_due(pool: ConnectionPool, clock: Clock) -> float | None:
    """Seconds until the next active enrollment falls due (None: none is waiting); the loop's ``next_due``."""
    with pool.connection() as conn:
        return seconds_until_due(conn, clock.now())


def observe(released: Released) -> None:
    """Count a committed release: the one place ``whatstig_followup_steps_total``, the release lag and the
    finished counter are incremented from the release path."""
    if released.action in ("retry", "fail"):
        outcome = "error"
    elif released.action == "queue":
        outcome = _category(released.reason) if released.reason else "sent"
    else:
        outcome = _category(released.reason or "none")
    labelled(FOLLOWUP_STEPS, released.action, outcome).inc()
    if released.lag_seconds is not None:
        FOLLOWUP_RELEASE_LAG.observe(released.lag_seconds)
    if released.finished == "stopped":
        labelled(FOLLOWUP_FINISHED, "stopped", released.reason or "none").inc()
    elif released.finished is not None:
        labelled(
            FOLLOWUP_FINISHED, released.finished, "error" if released.finished == "failed" else "none"
        ).inc()


def _category(reason: str) -> str:
    """A reason's bounded category for metric labels (``missing_variable:vars.x`` -> ``missing_variable``)."""
    return reason.split(":", 1)[0]
