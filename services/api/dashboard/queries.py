"""Reads only the dashboard makes (presentation, not domain): a project's name for the header, the names
of a list's contacts and sequences in one query instead of one a row. Every query filters on the signed-in
project."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from psycopg import Connection

from libs.common.core.sql import load_queries

QUERIES = load_queries("services.api.dashboard", "queries.sql")


@dataclass(frozen=True)
class ProjectHeader:
    name: str
    timezone: str


def project_header(conn: Connection[Any], project_id: uuid.UUID) -> ProjectHeader:
    row = conn.execute(QUERIES["project_header"], {"project_id": project_id}).fetchone()
    return ProjectHeader(row[0], row[1]) if row else ProjectHeader("", "UTC")


def contact_labels(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """Each contact's name (else its phone, else "erased")."""
    rows = conn.execute(QUERIES["contacts_by_ids"], {"project_id": project_id, "ids": list(set(ids))})
    return {row[0]: row[1] or row[2] or "erased contact" for row in rows}


def sequence_names(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]
) -> dict[uuid.UUID, str]:
    rows = conn.execute(QUERIES["sequence_names"], {"project_id": project_id, "ids": list(set(ids))})
    return {row[0]: row[1] for row in rows}
