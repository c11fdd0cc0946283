"""Privacy erasure, the rules' part: the contact's pending delayed executions are skipped
``contact_erased`` (their actions never run; the rows stay for the audit, with nothing of the person), the
finished ones forget the values their decision trace kept, its recorded triggers (and their rule runs, with
their traces) and the webhook deliveries about it are deleted. (Each context
erases its own rows; the ingress calls every part in the erasure's transaction.)"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.core.effects import Observe, after_commit
from libs.common.core.metrics import RULE_EXECUTIONS
from libs.common.core.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.rules", "erasure.sql")


def erase_contact(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, now: datetime
) -> None:
    """Erase what rules hold about a contact (the caller locked it for erasure)."""
    params = {"project_id": project_id, "contact_id": contact_id, "now": now}
    skipped = len(conn.execute(QUERIES["skip_pending_executions"], params).fetchall())
    if skipped:
        log.info(
            "delayed rules skipped: contact erased",
            extra={"project_id": str(project_id), "contact_id": str(contact_id), "skipped": skipped},
        )
        after_commit(
            conn,
            Observe(
                "erased contact's executions",
                lambda: RULE_EXECUTIONS.labels("skipped", "contact_erased").inc(skipped),
            ),
        )
    conn.execute(QUERIES["forget_traces"], params)
    conn.execute(QUERIES["delete_triggers"], params)
    conn.execute(QUERIES["delete_webhook_deliveries"], params)
