"""The release loop's work: claim the oldest due enrollment, release it (the domain's release step), commit,
then count what happened."""

from __future__ import annotations

import uuid

from psycopg.rows import class_row
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.settings import FollowupSettings
from libs.common.core.sql import load_queries
from libs.common.followups.release_step import (
    ClaimedEnrollment,
    Released,
    observe,
    record_failure,
    release_claimed,
)

QUERIES = load_queries("services.release", "claim.sql")


def release_one(pool: ConnectionPool, clock: Clock, settings: FollowupSettings) -> Released | None:
    """Release the oldest due enrollment, if any; returns what happened, or None when nothing is due."""
    now = clock.now()
    claimed_id: uuid.UUID | None = None
    try:
        # Pipeline mode: a statement whose result is read waits for it; the writes that follow the last
        # read travel together with the COMMIT in one round trip.
        with pool.connection() as conn, conn.pipeline():
            with conn.cursor(row_factory=class_row(ClaimedEnrollment)) as cur:
                row = cur.execute(QUERIES["claim_due_enrollment"], {"now": now}).fetchone()
            if row is None:
                return None
            claimed_id = row.id
            released = release_claimed(conn, row, settings, now=now)
            conn.commit()
    except Exception as exc:
        if claimed_id is None:
            raise
        released = record_failure(pool, claimed_id, exc, now, settings)
    observe(released)
    return released


def release_batch(pool: ConnectionPool, clock: Clock, settings: FollowupSettings, limit: int = 100) -> int:
    """Release due enrollments one transaction at a time, up to ``limit``; returns how many were handled."""
    handled = 0
    while handled < limit:
        if release_one(pool, clock, settings) is None:
            break
        handled += 1
    return handled
