"""What the follow-ups context deletes once its time is up: finished enrollments past their project's
retention (their step runs go with them). The retention job calls it a batch per transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.followups", "purge.sql")


def purge_finished_enrollments(conn: Connection[Any], *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` finished enrollments older than their project's ``retention_days``
    (default 90), oldest first; returns how many went. The one delete of enrollments outside
    :mod:`~libs.common.followups.transitions` (rows past their time, not a change of state)."""
    return conn.execute(QUERIES["finished_enrollments"], {"now": now, "limit": limit}).rowcount
