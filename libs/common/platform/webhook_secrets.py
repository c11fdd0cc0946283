"""A project's webhook signing secret (``projects.webhook_secret``) and its rotation with an overlap.

:func:`rotate_webhook_secret` draws a new secret; the one it replaces stays valid until the overlap ends
(``previous_valid_until``): meanwhile each delivery is signed by both, the new one first, so a receiver
that still holds the old secret and one that already holds the new both verify it; after it, only the new
one signs. A rotation during an overlap drops the oldest secret at once (two are valid at most). The
signing itself is the rules context's (``libs.common.rules.webhooks``), which reads both with its claim.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.contracts.limits import MAX_SECRET_OVERLAP_SECONDS
from libs.common.core.effects import Observe, after_commit
from libs.common.core.errors import NotFound
from libs.common.core.metrics import WEBHOOK_SECRET_ROTATIONS
from libs.common.core.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.platform", "webhook_secrets.sql")


class WebhookSecret(msgspec.Struct, kw_only=True, frozen=True):
    """The key that signs the project's webhooks."""

    secret: str
    #: Until when the secret it replaced still signs each delivery too (None: no overlap running).
    previous_valid_until: datetime | None


class RotateWebhookSecret(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How long the secret being replaced stays valid (absent: ``WEBHOOK_SECRET_OVERLAP_SECONDS``; 0: it
    ends at once, for a secret that leaked)."""

    overlap_seconds: Annotated[int, msgspec.Meta(ge=0, le=MAX_SECRET_OVERLAP_SECONDS)] | None = None


def webhook_secret(conn: Connection[Any], project_id: uuid.UUID, *, now: datetime) -> WebhookSecret:
    """The project's signing secret, and the end of the overlap of the one it replaced (if running)."""
    return _secret(conn, "webhook_secret", {"project_id": project_id, "now": now})


def rotate_webhook_secret(
    conn: Connection[Any], project_id: uuid.UUID, *, overlap: timedelta, now: datetime
) -> WebhookSecret:
    """Replace the project's signing secret; the old one keeps signing for ``overlap`` (see the module)."""
    params = {
        "project_id": project_id,
        "secret": secrets.token_hex(32),
        "until": now + overlap,
        "now": now,
    }
    rotated = _secret(conn, "rotate_webhook_secret", params)
    overlapping = "overlap" if rotated.previous_valid_until is not None else "immediate"
    extra = {
        "project_id": str(project_id),
        "previous_valid_until": rotated.previous_valid_until.isoformat()
        if rotated.previous_valid_until
        else None,
    }

    def observe() -> None:
        WEBHOOK_SECRET_ROTATIONS.labels(overlapping).inc()
        log.info("webhook secret rotated", extra=extra)

    after_commit(conn, Observe("webhook secret rotation", observe))
    return rotated


def _secret(conn: Connection[Any], query: str, params: dict[str, Any]) -> WebhookSecret:
    """The project's secret as ``query`` returns it (NotFound: no such project)."""
    with conn.cursor(row_factory=class_row(WebhookSecret)) as cur:
        row = cur.execute(QUERIES[query], params).fetchone()
    if row is None:
        raise NotFound("project not found", field="project_id")
    return row
