"""Projects and their API keys. A key is shown once at creation and stored only as its SHA-256."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from psycopg import Connection

from libs.common.core.errors import InvalidInput, NotFound, Unauthorized
from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.platform", "projects.sql")

#: Every API key starts with this, so a leaked key is easy to recognise and scan for.
KEY_PREFIX = "fu_"


@dataclass(frozen=True)
class NewProject:
    project_id: uuid.UUID
    api_key: str


def hash_key(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode()).digest()


def create_project(conn: Connection[Any], name: str, *, timezone: str = "UTC") -> NewProject:
    """Create a project and its first API key (returned in clear, once)."""
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidInput("name must be 1 to 200 characters", field="name")
    row = conn.execute(QUERIES["insert_project"], {"name": name, "timezone": timezone}).fetchone()
    assert row is not None
    project_id: uuid.UUID = row[0]
    return NewProject(project_id, create_api_key(conn, project_id))


def create_api_key(conn: Connection[Any], project_id: uuid.UUID, name: str = "default") -> str:
    api_key = KEY_PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        QUERIES["insert_api_key"],
        {"project_id": project_id, "name": name, "prefix": api_key[:8], "key_hash": hash_key(api_key)},
    )
    return api_key


def authenticate(conn: Connection[Any], api_key: str) -> uuid.UUID:
    """The project an API key belongs to; raises Unauthorized for an unknown or revoked key."""
    if not api_key.startswith(KEY_PREFIX):
        raise Unauthorized()
    row = conn.execute(QUERIES["project_for_key"], {"key_hash": hash_key(api_key)}).fetchone()
    if row is None:
        raise Unauthorized()
    project_id: uuid.UUID = row[0]
    return project_id


def require_project(conn: Connection[Any], project_id: uuid.UUID) -> None:
    """404 for an unknown project (events over the broker name their project without an API key)."""
    if conn.execute(QUERIES["project_exists"], {"project_id": project_id}).fetchone() is None:
        raise NotFound("project not found", field="project_id")


def project_name(conn: Connection[Any], project_id: uuid.UUID) -> tuple[str, str] | None:
    """The project's name and time zone; None for an unknown project."""
    row = conn.execute(QUERIES["project_name"], {"project_id": project_id}).fetchone()
    return (row[0], row[1]) if row else None
