"""Ingress of numbers: connected (which resumes the enrollments paused for want of a usable number) or
disconnected."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.contracts.platform_events import NumberConnected, NumberDisconnected
from libs.common.followups.enrollments import resume_waiting_for_a_number
from libs.common.ingress.apply import EventResult
from libs.common.platform import numbers
from libs.common.platform.numbers import NumberStatus


def number_status(
    conn: Connection[Any], project_id: uuid.UUID, event: NumberConnected | NumberDisconnected, now: datetime
) -> EventResult:
    """A number's new status; a connected number resumes the enrollments paused for want of one."""
    connected = isinstance(event, NumberConnected)
    kind = "number.connected" if connected else "number.disconnected"
    status: NumberStatus = "connected" if connected else "disconnected"
    number, previous = numbers.set_number_status(conn, project_id, event.number_id, status, now=now)
    result = EventResult(
        type=kind, applied=previous != number.status, number_id=number.id, status=number.status
    )
    if connected:
        result.resumed_enrollment_ids = resume_waiting_for_a_number(conn, project_id, now=now)
    return result
