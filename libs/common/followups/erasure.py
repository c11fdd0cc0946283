"""Privacy erasure, the follow-ups' part: the contact's enrollments keep no variables, keys or notes that
could identify the person. (Each context erases its own rows; the ingress calls every part in the
erasure's transaction.)"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.followups import transitions


def erase_contact(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, now: datetime
) -> None:
    """Erase what follow-ups hold about a contact (the caller locked it for erasure and stopped its
    follow-ups)."""
    transitions.anonymise(conn, project_id, contact_id, now=now)
