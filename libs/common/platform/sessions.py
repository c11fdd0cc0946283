"""Dashboard sessions, kept on the server: a row per signed-in browser, with the API key it signed in
with. The browser's cookie carries only the session's random token; the table stores its SHA-256.

A session is valid until it expires, is signed out (its row is deleted) or its key is revoked or expires
(checked by the one lookup, :func:`session_for`; a revocation also deletes the key's sessions). Expired
rows are deleted in batches by the retention job (:func:`purge_expired`).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from psycopg import Connection

from libs.common.core.sql import load_queries

if TYPE_CHECKING:
    from libs.common.platform.api_keys import Caller, Scope

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.platform", "sessions.sql")


@dataclass(frozen=True)
class DashboardSession:
    """A live session: the project it sees, the key it signed in with (and that key's scope)."""

    project_id: uuid.UUID
    id: uuid.UUID
    api_key_id: uuid.UUID
    scope: Scope
    expires_at: datetime
    project_name: str


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def start_session(conn: Connection[Any], caller: Caller, *, now: datetime, lifetime_seconds: int) -> str:
    """A new session of ``caller``'s key for ``lifetime_seconds``; returns its token (the cookie's value)."""
    token = secrets.token_urlsafe(32)
    row = conn.execute(
        QUERIES["insert_session"],
        {
            "project_id": caller.project_id,
            "api_key_id": caller.key_id,
            "token_hash": _hash(token),
            "now": now,
            "expires_at": now + timedelta(seconds=lifetime_seconds),
        },
    ).fetchone()
    assert row is not None
    log.info(
        "dashboard session started",
        extra={
            "project_id": str(caller.project_id),
            "api_key_id": str(caller.key_id),
            "session_id": str(row[0]),
        },
    )
    return token


def session_for(conn: Connection[Any], token: str, *, now: datetime) -> DashboardSession | None:
    """The live session of a token; None for an unknown, signed-out or expired one, or one whose key was
    revoked or expired."""
    if not token:
        return None
    row = conn.execute(QUERIES["session_for_token"], {"token_hash": _hash(token), "now": now}).fetchone()
    return DashboardSession(*row) if row else None


def end_session(conn: Connection[Any], token: str) -> None:
    """Sign out: the token opens nothing any more."""
    conn.execute(QUERIES["delete_session"], {"token_hash": _hash(token)})


def end_key_sessions(conn: Connection[Any], project_id: uuid.UUID, api_key_id: uuid.UUID) -> int:
    """End every session signed in with a key; returns how many."""
    return conn.execute(
        QUERIES["delete_key_sessions"], {"project_id": project_id, "api_key_id": api_key_id}
    ).rowcount


def purge_expired(conn: Connection[Any], *, now: datetime, limit: int) -> int:
    """Delete up to ``limit`` expired sessions (the retention job's batch); returns how many went."""
    return conn.execute(QUERIES["purge_expired_sessions"], {"now": now, "limit": limit}).rowcount
