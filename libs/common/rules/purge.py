"""What the rules context deletes once its time is up, a project and a batch at a time (the retention job
calls each in a transaction of its own): processed triggers, finished delayed-rule executions, finished bulk
jobs and finished webhook deliveries."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.rules", "purge.sql")


def purge_processed_triggers(
    conn: Connection[Any], project_id: uuid.UUID, *, now: datetime, limit: int
) -> int:
    """Delete at most ``limit`` of the project's triggers processed more than 7 days ago (with their rule
    runs), but those a pending delayed-rule execution still needs; returns how many went."""
    return _purge(conn, "processed_triggers", project_id, now, limit)


def purge_rule_executions(conn: Connection[Any], project_id: uuid.UUID, *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` of the project's executed or skipped delayed-rule executions older than 30
    days."""
    return _purge(conn, "rule_executions", project_id, now, limit)


def purge_bulk_jobs(conn: Connection[Any], project_id: uuid.UUID, *, now: datetime, limit: int) -> int:
    """Delete at most ``limit`` of the project's bulk jobs finished more than 30 days ago, with their
    contacts."""
    return _purge(conn, "bulk_jobs", project_id, now, limit)


def purge_webhook_deliveries(
    conn: Connection[Any], project_id: uuid.UUID, *, now: datetime, limit: int
) -> int:
    """Delete at most ``limit`` of the project's delivered or given-up webhook deliveries older than 30
    days."""
    return _purge(conn, "webhook_deliveries", project_id, now, limit)


def _purge(conn: Connection[Any], query: str, project_id: uuid.UUID, now: datetime, limit: int) -> int:
    return conn.execute(QUERIES[query], {"project_id": project_id, "now": now, "limit": limit}).rowcount
