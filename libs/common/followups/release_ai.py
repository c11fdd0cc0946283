"""The second pass of an AI step: its enrollment locked again under the fence the first pass took, then the
step released with the model's draft through every check again (the model was called holding no lock)."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.core.settings import FollowupSettings
from libs.common.followups.release_claim import lock_fenced
from libs.common.followups.release_step import AiDraft, Released, release_claimed

log = logging.getLogger(__name__)


def release_drafted(
    conn: Connection[Any],
    project_id: uuid.UUID,
    enrollment_id: uuid.UUID,
    step_index: int,
    fence: int,
    draft: AiDraft,
    settings: FollowupSettings,
    *,
    now: datetime,
) -> Released | None:
    """The second pass of an AI step: lock the enrollment, check the fence (still active, same step, same
    attempts: no other pass took the step over after the lease), then release the step with the draft
    through every check again. None: fenced out (the draft is dropped)."""
    row = lock_fenced(conn, project_id, enrollment_id, step_index, fence)
    if row is None:
        log.info(
            "ai draft dropped: fenced out",
            extra={"enrollment_id": str(enrollment_id), "step_index": step_index, "fence": fence},
        )
        return None
    return release_claimed(conn, row, settings, now=now, draft=draft)
