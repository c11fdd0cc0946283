"""Projects. A new project comes with its first API key, an admin key (:mod:`.api_keys`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.core import validation
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.core.sql import load_queries
from libs.common.platform.api_keys import ApiKeyCreate, create_key

QUERIES = load_queries("libs.common.platform", "projects.sql")


@dataclass(frozen=True)
class NewProject:
    project_id: uuid.UUID
    api_key: str


def create_project(
    conn: Connection[Any], name: str, *, timezone: str = "UTC", now: datetime | None = None
) -> NewProject:
    """Create a project and its first API key, an admin key named ``default`` (returned in clear, once)."""
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidInput("name must be 1 to 200 characters", field="name")
    row = conn.execute(QUERIES["insert_project"], {"name": name, "timezone": timezone}).fetchone()
    assert row is not None
    project_id: uuid.UUID = row[0]
    key = create_key(
        conn,
        project_id,
        ApiKeyCreate(name="default", scope="admin"),
        now=SYSTEM_CLOCK.now() if now is None else now,
    )
    return NewProject(project_id, key.api_key)


def require_project(conn: Connection[Any], project_id: uuid.UUID) -> None:
    """404 for an unknown project (events over the broker name their project without an API key)."""
    if conn.execute(QUERIES["project_exists"], {"project_id": project_id}).fetchone() is None:
        raise NotFound("project not found", field="project_id")


def project_ids(conn: Connection[Any]) -> list[uuid.UUID]:
    """Every project's id, in order."""
    return [row[0] for row in conn.execute(QUERIES["project_ids"])]


def project_name(conn: Connection[Any], project_id: uuid.UUID) -> tuple[str, str] | None:
    """The project's name and time zone; None for an unknown project."""
    row = conn.execute(QUERIES["project_name"], {"project_id": project_id}).fetchone()
    return (row[0], row[1]) if row else None


def set_timezone(conn: Connection[Any], project_id: uuid.UUID, timezone: str) -> None:
    """Set the project's time zone (``timezone`` an IANA name, else InvalidInput naming ``timezone``): the
    zone of its send windows and anchor times for a contact without one, and of its business hours."""
    conn.execute(
        QUERIES["set_timezone"], {"project_id": project_id, "timezone": validation.timezone(timezone)}
    )
