"""A project's API keys: created with a name, a scope and an optional expiry, listed, revoked.

A key is shown once, when it is created, and stored only as its SHA-256 (and its first 8 characters, to
recognise it in a list). A key authenticates while it is neither revoked nor expired; each use is
recorded in ``last_used_at`` at most once a minute (a conditional update: a key used within the minute
is not written again). A project keeps at least one live admin key: revoking the last one is refused.

Scopes (docs/api.md, "Scopes"): ``admin`` may do everything, keys included; ``write`` everything but
the keys; ``read`` only reads; ``events`` only the platform's events and the send lane. What a request
needs is the transport's to say (:func:`allows` answers whether a key's scope grants it).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, get_args

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.contracts.limits import MAX_NAME_LENGTH, Name
from libs.common.core.errors import Conflict, InvalidInput, NotFound, Unauthorized
from libs.common.core.sql import load_queries
from libs.common.platform import sessions

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.platform", "api_keys.sql")

#: Every API key starts with this, so a leaked key is easy to recognise and scan for.
KEY_PREFIX = "fu_"

Scope = Literal["admin", "write", "read", "events"]
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)

#: What each scope grants: the scopes whose requests a key of that scope may make.
GRANTS: Final[dict[Scope, frozenset[Scope]]] = {
    "admin": frozenset({"admin", "write", "read", "events"}),
    "write": frozenset({"write", "read", "events"}),
    "read": frozenset({"read"}),
    "events": frozenset({"events"}),
}


def allows(scope: Scope, needed: Scope) -> bool:
    """Whether a key of ``scope`` may make a request that needs ``needed``."""
    return needed in GRANTS[scope]


class ApiKeyCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A new key: what it is for (a name), what it may do, and until when (none: until revoked)."""

    name: Name
    scope: Scope
    expires_at: datetime | None = None


class ApiKey(msgspec.Struct, kw_only=True, frozen=True):
    """A key as listed: never the key itself (only its first characters, ``prefix``)."""

    id: uuid.UUID
    name: str
    prefix: str
    scope: Scope
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


class NewApiKey(msgspec.Struct, kw_only=True, frozen=True):
    """A key just created: ``api_key`` is shown this once."""

    api_key: str
    key: ApiKey


@dataclass(frozen=True)
class Caller:
    """Who a request's key is: its project, the key and the key's scope."""

    project_id: uuid.UUID
    key_id: uuid.UUID
    scope: Scope


def hash_key(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode()).digest()


def create_key(
    conn: Connection[Any], project_id: uuid.UUID, data: ApiKeyCreate, *, now: datetime
) -> NewApiKey:
    """Create a key; its clear text is in the result, and nowhere else ever again."""
    name = data.name.strip()
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise InvalidInput(f"name must be 1 to {MAX_NAME_LENGTH} characters, not blank", field="name")
    if data.scope not in SCOPES:
        raise InvalidInput(f"scope must be one of {', '.join(SCOPES)}", field="scope")
    if data.expires_at is not None:
        if data.expires_at.tzinfo is None:
            raise InvalidInput("expires_at needs a time zone offset", field="expires_at")
        if data.expires_at <= now:
            raise InvalidInput("expires_at must be in the future", field="expires_at")
    api_key = KEY_PREFIX + secrets.token_urlsafe(32)
    params = {
        "project_id": project_id,
        "name": name,
        "prefix": api_key[:8],
        "key_hash": hash_key(api_key),
        "scope": data.scope,
        "expires_at": data.expires_at,
        "now": now,
    }
    with conn.cursor(row_factory=class_row(ApiKey)) as cur:
        key = cur.execute(QUERIES["insert_api_key"], params).fetchone()
    assert key is not None
    log.info(
        "api key created",
        extra={"project_id": str(project_id), "api_key_id": str(key.id), "scope": key.scope},
    )
    return NewApiKey(api_key=api_key, key=key)


def authenticate(conn: Connection[Any], api_key: str, *, now: datetime) -> Caller:
    """The caller a key is; Unauthorized for an unknown, revoked or expired key. Records the use (at most
    once a minute per key)."""
    if not api_key.startswith(KEY_PREFIX):
        raise Unauthorized()
    row = conn.execute(QUERIES["key_for_hash"], {"key_hash": hash_key(api_key), "now": now}).fetchone()
    if row is None:
        raise Unauthorized()
    project_id, key_id, scope, last_used_at = row
    if last_used_at is None or (now - last_used_at).total_seconds() >= 60:
        conn.execute(QUERIES["touch_api_key"], {"project_id": project_id, "id": key_id, "now": now})
    return Caller(project_id, key_id, scope)


def list_keys(
    conn: Connection[Any], project_id: uuid.UUID, *, limit: int, after: uuid.UUID | None = None
) -> list[ApiKey]:
    with conn.cursor(row_factory=class_row(ApiKey)) as cur:
        params = {"project_id": project_id, "limit": limit, "after": after}
        return cur.execute(QUERIES["list_api_keys"], params).fetchall()


def get_key(conn: Connection[Any], project_id: uuid.UUID, key_id: uuid.UUID) -> ApiKey:
    with conn.cursor(row_factory=class_row(ApiKey)) as cur:
        key = cur.execute(QUERIES["get_api_key"], {"project_id": project_id, "id": key_id}).fetchone()
    if key is None:
        raise NotFound("API key not found", field="key_id")
    return key


class LastAdminKey(Conflict):
    """This is the project's last live admin key: create another admin key before revoking it."""

    code = "last_admin_key"


def revoke_key(conn: Connection[Any], project_id: uuid.UUID, key_id: uuid.UUID, *, now: datetime) -> ApiKey:
    """Revoke a key (again: nothing changes) and end the dashboard sessions signed in with it. The
    project's last live admin key is not revoked (:class:`LastAdminKey`)."""
    admins = [
        row[0]
        for row in conn.execute(QUERIES["lock_live_admin_keys"], {"project_id": project_id, "now": now})
    ]
    if admins == [key_id]:
        raise LastAdminKey()
    with conn.cursor(row_factory=class_row(ApiKey)) as cur:
        key = cur.execute(
            QUERIES["revoke_api_key"], {"project_id": project_id, "id": key_id, "now": now}
        ).fetchone()
    if key is None:
        raise NotFound("API key not found", field="key_id")
    ended = sessions.end_key_sessions(conn, project_id, key_id)
    log.info(
        "api key revoked",
        extra={"project_id": str(project_id), "api_key_id": str(key_id), "sessions_ended": ended},
    )
    return key
