"""Privacy erasure, the rules' part: the contact's recorded triggers (and their rule runs) and the webhook
deliveries about it are deleted. (Each context erases its own rows; the ingress calls every part in the
erasure's transaction.)"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import Connection

from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.rules", "erasure.sql")


def erase_contact(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID) -> None:
    """Erase what rules hold about a contact (the caller locked it for erasure)."""
    params = {"project_id": project_id, "contact_id": contact_id}
    conn.execute(QUERIES["delete_triggers"], params)
    conn.execute(QUERIES["delete_webhook_deliveries"], params)
