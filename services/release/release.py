"""The release loop's work: claim the oldest due enrollment, release it (the domain's release step), commit,
then count what happened."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

from psycopg.rows import class_row
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.db import server_unavailable
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


def release_one(
    pool: ConnectionPool, clock: Clock, settings: FollowupSettings, ai_lease: timedelta | None = None
) -> Released | None:
    """Release the oldest due enrollment, if any; returns what happened, or None when nothing is due.

    ``ai_lease`` (a model is configured): an AI step is leased for that long and returned as ``lease``; the
    caller sends it to the ai_steps service once committed."""
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
            released = release_claimed(conn, row, settings, now=now, ai_lease=ai_lease)
            conn.commit()
    except Exception as exc:
        # the database went away mid-release: not the enrollment's fault (no failure counted, no back-off);
        # the transaction is gone with the connection, and the loop tries again once the server is back
        if claimed_id is None or server_unavailable(exc):
            raise
        released = record_failure(pool, claimed_id, exc, now, settings)
    observe(released)
    return released


def seconds_until_next_due(pool: ConnectionPool, clock: Clock) -> float | None:
    """Seconds until the next active enrollment falls due (None: none is waiting); the loop's ``next_due``."""
    with pool.connection() as conn:
        row = conn.execute(QUERIES["next_due"], {"now": clock.now()}).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def release_batch(
    pool: ConnectionPool,
    clock: Clock,
    settings: FollowupSettings,
    limit: int = 100,
    *,
    ai_lease: timedelta | None = None,
    on_lease: Callable[[Released], None] | None = None,
) -> int:
    """Release due enrollments one transaction at a time, up to ``limit``; returns how many were handled.
    ``on_lease`` hears of each AI step leased (after its commit)."""
    handled = 0
    while handled < limit:
        released = release_one(pool, clock, settings, ai_lease)
        if released is None:
            break
        if released.action == "lease" and on_lease is not None:
            on_lease(released)
        handled += 1
    return handled
