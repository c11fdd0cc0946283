"""Ingress of numbers: connected (which resumes the enrollments paused for want of a usable number) or
disconnected; a number's new quality rating and its portfolio's tier, and a portfolio's tier."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.contracts.platform_events import (
    NumberConnected,
    NumberDisconnected,
    NumberQualityChanged,
    PortfolioTierChanged,
)
from libs.common.followups.enrollments import resume_waiting_for_a_number
from libs.common.ingress.apply import EventResult
from libs.common.platform import numbers, portfolios
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


def quality_changed(
    conn: Connection[Any], project_id: uuid.UUID, event: NumberQualityChanged, now: datetime
) -> EventResult:
    """The tier the provider gave a number is its portfolio's (a number in none: nothing changes)."""
    numbers.get_number(conn, project_id, event.number_id)  # 404 for an unknown number
    portfolio_id = portfolios.set_tier_of_number(conn, project_id, event.number_id, event.tier, now=now)
    return EventResult(
        type="number.quality_changed", applied=portfolio_id is not None, number_id=event.number_id
    )


def tier_changed(
    conn: Connection[Any], project_id: uuid.UUID, event: PortfolioTierChanged, now: datetime
) -> EventResult:
    """A portfolio's new tier."""
    update = portfolios.PortfolioUpdate(tier=event.tier)
    portfolios.update_portfolio(conn, project_id, event.portfolio_id, update, now=now)
    return EventResult(type="portfolio.tier_changed")
