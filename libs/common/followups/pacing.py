"""A number's pacing gap, adaptive: the project's ``send_delay_ms``, widened when the provider rate-limits
the number (error 130429), then recovering.

A rate limit doubles the number's gap (from its gap at that moment: at least :data:`FLOOR`, at most
:data:`CEILING`); from then on the widened gap halves every :data:`RECOVERY_STEP`, and once below the floor
the number is back to the project's gap. A burst of rate limits widens it step by step; a quiet number
recovers on its own, with no job to run: the gap is computed from when it was widened (on the clock the
release step passes). The release step's pacing constraint
(:func:`libs.common.followups.constraints.check`) keeps the gap :func:`gap_ms` says.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, Final

from psycopg import Connection

from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.followups", "pacing.sql")
#: The pacing row's own statements (made, locked, moved on) are the release step's.
RELEASE_QUERIES = load_queries("libs.common.followups", "release_step.sql")

#: The least gap a rate-limited number keeps (the first widening of an unpaced number), and the most.
FLOOR: Final = timedelta(seconds=1)
CEILING: Final = timedelta(minutes=2)
#: How often a widened gap halves.
RECOVERY_STEP: Final = timedelta(minutes=1)

_FLOOR_MS: Final = FLOOR // timedelta(milliseconds=1)
_CEILING_MS: Final = CEILING // timedelta(milliseconds=1)


def gap_ms(send_delay_ms: int, widened_gap_ms: int, widened_at: datetime | None, now: datetime) -> int:
    """The number's gap now: the project's ``send_delay_ms``, or its widened gap halved once per
    :data:`RECOVERY_STEP` since it was widened while that is at least the floor, whichever is larger."""
    if widened_gap_ms <= 0 or widened_at is None:
        return send_delay_ms
    halvings = max(0, (now - widened_at) // RECOVERY_STEP)
    widened = widened_gap_ms >> min(halvings, 32)
    return max(send_delay_ms, widened if widened >= _FLOOR_MS else 0)


def widen(conn: Connection[Any], project_id: uuid.UUID, number_id: uuid.UUID, *, now: datetime) -> int:
    """The provider rate-limited the number: its gap doubles (within the floor and the ceiling); returns
    the new gap in milliseconds."""
    params = {"project_id": project_id, "number_id": number_id, "now": now}
    conn.execute(RELEASE_QUERIES["insert_pacing"], params)
    row = conn.execute(QUERIES["lock_widening"], params).fetchone()
    assert row is not None  # made just now when it was missing
    widened_gap_ms, widened_at, send_delay_ms = row
    current = gap_ms(send_delay_ms, widened_gap_ms, widened_at, now)
    gap = min(_CEILING_MS, max(_FLOOR_MS, 2 * current))
    conn.execute(
        QUERIES["widen"], params | {"gap_ms": gap, "next_release_at": now + timedelta(milliseconds=gap)}
    )
    return gap
