"""The release claim: a project's oldest due enrollment, locked ``FOR UPDATE SKIP LOCKED`` (other workers'
rows are skipped; its statement is run with the contact's state, :mod:`~libs.common.followups.release_state`),
what the release step reads of it, the projects with due enrollments in turns (the
release loop serves them one after another), and when the next one falls due (the loop sleeps until then).
Also the leased AI step's enrollment, read for its model call.

Every claim names its project (an equality on ``project_id``: on Citus, a statement routed to one shard);
only the reads without locks (the walk of the projects, the next due time) span projects."""

from __future__ import annotations

import uuid
from datetime import datetime
from operator import itemgetter
from typing import Any

import msgspec
from psycopg import Connection
from psycopg.pq.abc import PGresult
from psycopg.rows import RowMaker, class_row

from libs.common.core.queued import read_rows
from libs.common.core.sql import load_queries, numbered

QUERIES = load_queries("libs.common.followups", "release_claim.sql")


class ClaimedEnrollment(msgspec.Struct, frozen=True):
    """The claimed enrollment: what the release step reads of it."""

    id: uuid.UUID
    project_id: uuid.UUID
    sequence_id: uuid.UUID | None
    version_id: uuid.UUID
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    number_id: uuid.UUID | None
    step_index: int
    next_run_at: datetime
    #: When the current step was scheduled (deferrals move next_run_at, not this).
    step_due_at: datetime | None
    anchor_at: datetime | None
    variables: dict[str, Any]
    enrolled_at: datetime
    last_step_at: datetime | None
    last_message_id: uuid.UUID | None
    stop_on_reply: bool
    waiting_reason: str | None
    unavailable_since: datetime | None
    #: The campaign that released the enrollment (its messages name it), if one did.
    campaign_id: uuid.UUID | None
    #: Waiting at a wait_for_reply step with a reply path: the step a reply moves it to (-1: the end).
    reply_step: int | None = None
    #: When it took a reply path: replies before this no longer stop it.
    reply_taken_at: datetime | None = None


class LeasedStep(msgspec.Struct, kw_only=True, frozen=True):
    """A leased AI step's enrollment, as its prompt needs it."""

    id: uuid.UUID
    project_id: uuid.UUID
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    version_id: uuid.UUID
    step_index: int
    variables: dict[str, Any]


#: Numbered once: the release batch reads it at every turn (queued into its pipeline, no cursor).
_DUE_PROJECTS = numbered(QUERIES["due_projects"])


def due_projects(conn: Connection[Any], now: datetime, *, after: uuid.UUID, projects: int) -> list[uuid.UUID]:
    """The projects with a due active enrollment, in turns: those after ``after`` in id order, then from the
    first (wrapping around), at most ``projects`` of them (read without locks)."""
    params = {"now": now, "after": after, "projects": projects}
    return read_rows(conn, _DUE_PROJECTS, params, _first_column)


def _first_column(result: PGresult) -> RowMaker[Any]:
    """Rows as their first column's value."""
    return itemgetter(0)


def seconds_until_due(conn: Connection[Any], now: datetime) -> float | None:
    """Seconds until the next active enrollment falls due (None: none is waiting)."""
    row = conn.execute(QUERIES["next_due"], {"now": now}).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def leased_step(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, step_index: int, fence: int
) -> LeasedStep | None:
    """The enrollment of a leased AI step, read without locks; None when it is no longer at the step under
    the same fence (another pass took it over: the model is not called)."""
    params = {"project_id": project_id, "id": enrollment_id, "step_index": step_index, "fence": fence}
    with conn.cursor(row_factory=class_row(LeasedStep)) as cur:
        return cur.execute(QUERIES["leased_step"], params).fetchone()


def lock_fenced(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID, step_index: int, fence: int
) -> ClaimedEnrollment | None:
    """Lock a leased AI step's enrollment for its second pass: still active, at the same step and attempts
    (the fence); None when fenced out."""
    params = {"project_id": project_id, "id": enrollment_id, "step_index": step_index, "fence": fence}
    with conn.cursor(row_factory=class_row(ClaimedEnrollment)) as cur:
        return cur.execute(QUERIES["lock_fenced"], params).fetchone()


def enrollment_to_release(
    conn: Connection[Any], project_id: uuid.UUID, enrollment_id: uuid.UUID
) -> ClaimedEnrollment | None:
    """An active enrollment as the release step reads it, due or not, without a lock (a preview's own, made
    in its savepoint); None once it is no longer active."""
    params = {"project_id": project_id, "id": enrollment_id}
    with conn.cursor(row_factory=class_row(ClaimedEnrollment)) as cur:
        return cur.execute(QUERIES["enrollment_to_release"], params).fetchone()
