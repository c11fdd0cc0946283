"""The daily clean-up, a coordinator: each step calls its table's owner's batched delete (at most
:data:`BATCH` rows per transaction: short locks), project by project (each delete has an equality on
project_id: on a cluster distributed by project it runs on the project's node alone; docs/scaling.md),
resting between batches (the release path keeps most of the machine), until nothing is left, and counts
what it deleted in ``whatstig_retention_rows_deleted_total{table}``. Retention owns no table: the deletes
are the owners' (:mod:`~libs.common.followups.transitions`, :mod:`~libs.common.rules.purge`,
:mod:`~libs.common.core.outbox`, :mod:`~libs.common.platform.sessions`).

    followup_enrollments     finished, older than the project's retention_days (default 90; step runs go too)
    followup_triggers        processed, older than 7 days (rule runs go too), unless a pending delayed
                             rule still needs it
    rule_pending_executions  executed or skipped, older than 30 days (seed 002)
    followup_bulk_jobs       finished, older than 30 days (with their contacts)
    webhook_deliveries       delivered or given up, older than 30 days
    outbox                   published more than 7 days ago
    dashboard_sessions       expired (past DASHBOARD_SESSION_SECONDS; never valid after that anyway): a
                             reference table, not a project's, deleted in one walk (GLOBAL_STEPS)

Then each project's live-enrollment counter (what a plan limit reads) is reconciled: its live enrollments
are counted anew, a drift is corrected, logged (a warning with the project and both figures) and counted
in ``whatstig_followup_live_count_drift_total{direction}``.

The job runs in one process at a time (an advisory lock): another replica finds it taken and does nothing.
It returns whether every step succeeded; ``last_job_success`` is set by the caller only then. PostgreSQL
lost mid-run (a failover, say) cuts the run short with :class:`DatabaseUnavailable`, after the outage's one
warning: the remaining steps would fail the same way, and the lock ended with its session (the next run,
on the new primary, takes it there).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, Protocol

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.core import outbox
from libs.common.core.db import DATABASE, server_unavailable
from libs.common.core.errors import DatabaseUnavailable
from libs.common.core.metrics import FOLLOWUP_LIVE_DRIFT, RETENTION_DELETED
from libs.common.core.sql import load_queries
from libs.common.followups import transitions
from libs.common.platform import sessions
from libs.common.platform.projects import project_ids
from libs.common.rules import purge as rules_purge

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.retention", "cleanup.sql")

#: Rows deleted per transaction.
BATCH: Final = 5_000
#: After each full batch the job rests this many times as long as the batch took: the release path keeps
#: most of the machine while a large backlog is deleted (a daily job need not hurry; 1,000,000 rows still
#: go in well under a minute).
PAUSE_RATIO: Final = 2.0


class Purge(Protocol):
    """An owner's batched delete of one project's rows: at most ``limit`` rows past their time, in the
    caller's transaction; returns how many went."""

    def __call__(self, conn: Connection[Any], project_id: uuid.UUID, *, now: datetime, limit: int) -> int: ...


class GlobalPurge(Protocol):
    """An owner's batched delete of a reference table's rows (no project's): as :class:`Purge`."""

    def __call__(self, conn: Connection[Any], *, now: datetime, limit: int) -> int: ...


#: The steps, in order, each run for every project in turn: (the table counted, its owner's batched delete,
#: the rows per transaction).
STEPS: Final[tuple[tuple[str, Purge, int], ...]] = (
    ("followup_enrollments", transitions.purge_finished, BATCH),
    ("followup_triggers", rules_purge.purge_processed_triggers, BATCH),
    ("rule_pending_executions", rules_purge.purge_rule_executions, BATCH),
    ("followup_bulk_jobs", rules_purge.purge_bulk_jobs, 1),  # a job takes its (up to 100,000) contacts
    ("webhook_deliveries", rules_purge.purge_webhook_deliveries, BATCH),
    ("outbox", outbox.purge_published, BATCH),
)
#: The steps of the reference tables, after those, once each.
GLOBAL_STEPS: Final[tuple[tuple[str, GlobalPurge, int], ...]] = (
    ("dashboard_sessions", sessions.purge_expired, BATCH),
)


#: One batch of a step: deletes at most the step's rows per transaction in the given transaction, at the
#: given time; returns how many went.
_Batch = Callable[[Connection[Any], datetime], int]


def run_retention(pool: ConnectionPool, now: Callable[[], datetime]) -> bool | None:
    """Run every step (a project's step for each project in turn); True when each succeeded, False when one
    failed (logged; the others still run), None when another process holds the job;
    :class:`DatabaseUnavailable` when PostgreSQL is lost."""
    try:
        return _run(pool, now)
    except psycopg.OperationalError as exc:
        if not server_unavailable(exc):
            raise
        DATABASE.failed(exc)  # the outage's one warning
        raise DatabaseUnavailable() from exc


def _run(pool: ConnectionPool, now: Callable[[], datetime]) -> bool | None:
    with pool.connection() as conn:
        projects = project_ids(conn)  # read before the lock: nothing may fail between it and the unlock
    steps = [
        (table, [_of_project(purge, project_id, limit) for project_id in projects], limit)
        for table, purge, limit in STEPS
    ]
    steps += [(table, [_of_reference(purge, limit)], limit) for table, purge, limit in GLOBAL_STEPS]
    with pool.connection() as lock:
        lock.autocommit = True
        taken = lock.execute(QUERIES["try_lock"]).fetchone()
        if not taken or not taken[0]:
            log.info("retention skipped: another process runs it", extra={"job": "followup-retention"})
            return None
        ok = True
        for table, batches, limit in steps:
            try:
                deleted = sum(_delete_all(pool, table, batch, limit, now) for batch in batches)
            except Exception as exc:
                if isinstance(exc, psycopg.OperationalError) and server_unavailable(exc):
                    raise  # the lock ends with its session
                ok = False
                log.exception(
                    "retention step failed",
                    extra={"job": "followup-retention", "step": table, "error": repr(exc)},
                )
                continue
            log.info(
                "retention step done",
                extra={"job": "followup-retention", "step": table, "deleted": deleted},
            )
        try:
            for project_id in projects:
                _reconcile_live(pool, project_id)
        except Exception as exc:
            if isinstance(exc, psycopg.OperationalError) and server_unavailable(exc):
                raise
            ok = False
            log.exception(
                "retention step failed",
                extra={"job": "followup-retention", "step": "live_count", "error": repr(exc)},
            )
        lock.execute(QUERIES["unlock"])
        lock.autocommit = False
        return ok


def _of_project(purge: Purge, project_id: uuid.UUID, limit: int) -> _Batch:
    return lambda conn, now: purge(conn, project_id, now=now, limit=limit)


def _of_reference(purge: GlobalPurge, limit: int) -> _Batch:
    return lambda conn, now: purge(conn, now=now, limit=limit)


def _delete_all(
    pool: ConnectionPool, table: str, batch: _Batch, limit: int, now: Callable[[], datetime]
) -> int:
    """Delete a batch per transaction until a batch comes back short; returns how many rows went."""
    total = 0
    while True:
        started = time.monotonic()
        with pool.connection() as conn:
            deleted = batch(conn, now())
        RETENTION_DELETED.labels(table).inc(deleted)
        total += deleted
        if deleted < limit:
            return total
        time.sleep((time.monotonic() - started) * PAUSE_RATIO)


def _reconcile_live(pool: ConnectionPool, project_id: uuid.UUID) -> None:
    """Recount the project's live enrollments (a transaction of its own); a drift is corrected, logged and
    counted. One whose counter another transaction holds is postponed to the next run (logged)."""
    try:
        with pool.connection() as conn:
            live, counted = transitions.recount_live(conn, project_id)
    except psycopg.errors.LockNotAvailable:
        log.info(
            "live enrollment recount postponed: its counter is held",
            extra={"job": "followup-retention", "project_id": str(project_id)},
        )
        return
    if live != counted:
        FOLLOWUP_LIVE_DRIFT.labels("over" if counted > live else "under").inc(abs(counted - live))
        log.warning(
            "live enrollment count corrected",
            extra={
                "job": "followup-retention",
                "project_id": str(project_id),
                "live": live,
                "counted": counted,
            },
        )
