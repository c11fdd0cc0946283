"""What the rules context deletes once its time is up, a batch at a time (the retention job calls each in
a transaction of its own): processed triggers, finished delayed-rule executions, finished bulk jobs and
finished webhook deliveries."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.rules", "purge.sql")


def purge_processed_triggers(conn: Connection[Any], *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` triggers processed more than 7 days ago (with their rule runs), but those a
    pending delayed-rule execution still needs; returns how many went."""
    return _purge(conn, "processed_triggers", now, limit)


def purge_rule_executions(conn: Connection[Any], *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` executed or skipped delayed-rule executions older than 30 days."""
    return _purge(conn, "rule_executions", now, limit)


def purge_bulk_jobs(conn: Connection[Any], *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` bulk jobs finished more than 30 days ago, with their contacts."""
    return _purge(conn, "bulk_jobs", now, limit)


def purge_webhook_deliveries(conn: Connection[Any], *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` delivered or given-up webhook deliveries older than 30 days."""
    return _purge(conn, "webhook_deliveries", now, limit)


def _purge(conn: Connection[Any], query: str, now: datetime, limit: int) -> int:
    return conn.execute(QUERIES[query], {"now": now, "limit": limit}).rowcount
