"""Business portfolios: the messaging limit WhatsApp puts on a business, shared by all its numbers (250,
1,000, 10,000, 100,000 or unlimited unique recipients of business-initiated conversations in a rolling
24 h). A number belongs to at most one portfolio; the tier is a setting (``/v1/portfolios``) or what the
platform said (``number.quality_changed``, ``portfolio.tier_changed``).

:func:`admit` is what a follow-up asks before it opens a business-initiated conversation with a contact:
a contact the portfolio opened one with in the last 24 h is not new; a new one is counted in the hour's
bucket of its number (O(1) per send: one row a recipient, at most 25 buckets a number, never a count over
messages), within the tier's limit and, fair across the portfolio's numbers, each number's equal share of
it (no number can take another's).
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any, Final

import msgspec
from psycopg import Connection
from psycopg.rows import dict_row

from libs.common.contracts.limits import Name
from libs.common.contracts.platform_events import MessagingTier
from libs.common.core import validation
from libs.common.core.errors import NotFound
from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.platform", "portfolios.sql")

#: A portfolio's messaging limit tier (WhatsApp's ``TIER_250`` ... ``TIER_UNLIMITED``).
Tier = MessagingTier
#: Unique recipients of business-initiated conversations a tier allows in 24 h (None: no limit).
LIMITS: Final[dict[str, int | None]] = {
    "tier_250": 250,
    "tier_1k": 1_000,
    "tier_10k": 10_000,
    "tier_100k": 100_000,
    "tier_unlimited": None,
}
#: How long a recipient counts, and an hour's bucket (counted while any of its hour is inside the window).
WINDOW: Final = timedelta(hours=24)
_BUCKET_SPAN: Final = WINDOW + timedelta(hours=1)


class PortfolioCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name
    tier: Tier = "tier_250"


class PortfolioUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A partial update: absent fields are kept."""

    name: Name | None = None
    tier: Tier | None = None


class Portfolio(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    name: str
    tier: Tier
    #: The unique recipients its tier allows in 24 h (null: unlimited).
    limit: Annotated[int, msgspec.Meta(ge=1)] | None = None
    number_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    created_at: datetime
    updated_at: datetime


def _portfolio(row: dict[str, Any]) -> Portfolio:
    return msgspec.convert(row | {"limit": LIMITS[row["tier"]]}, Portfolio)


def create_portfolio(
    conn: Connection[Any], project_id: uuid.UUID, data: PortfolioCreate, *, now: datetime
) -> Portfolio:
    params = {"project_id": project_id, "name": validation.name(data.name), "tier": data.tier, "now": now}
    row = conn.execute(QUERIES["insert_portfolio"], params).fetchone()
    assert row is not None
    return get_portfolio(conn, project_id, row[0])


def get_portfolio(conn: Connection[Any], project_id: uuid.UUID, portfolio_id: uuid.UUID) -> Portfolio:
    """One portfolio of the project (404 for an unknown one, or another project's)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(QUERIES["get_portfolio"], {"project_id": project_id, "id": portfolio_id}).fetchone()
    if row is None:
        raise NotFound("portfolio not found", field="portfolio_id")
    return _portfolio(row)


def list_portfolios(
    conn: Connection[Any], project_id: uuid.UUID, *, limit: int, after: uuid.UUID | None = None
) -> list[Portfolio]:
    with conn.cursor(row_factory=dict_row) as cur:
        params = {"project_id": project_id, "limit": limit, "after": after}
        return [_portfolio(row) for row in cur.execute(QUERIES["list_portfolios"], params).fetchall()]


def update_portfolio(
    conn: Connection[Any],
    project_id: uuid.UUID,
    portfolio_id: uuid.UUID,
    data: PortfolioUpdate,
    *,
    now: datetime,
) -> Portfolio:
    """A new name or tier (the tier as a setting)."""
    name = validation.name(data.name) if data.name is not None else None
    params = {"project_id": project_id, "id": portfolio_id, "name": name, "tier": data.tier, "now": now}
    if conn.execute(QUERIES["update_portfolio"], params).fetchone() is None:
        raise NotFound("portfolio not found", field="portfolio_id")
    return get_portfolio(conn, project_id, portfolio_id)


def set_tier_of_number(
    conn: Connection[Any], project_id: uuid.UUID, number_id: uuid.UUID, tier: Tier, *, now: datetime
) -> uuid.UUID | None:
    """The tier the provider gave a number is its portfolio's (None: the number has none)."""
    params = {"project_id": project_id, "number_id": number_id, "tier": tier, "now": now}
    row = conn.execute(QUERIES["set_tier_of_number"], params).fetchone()
    return row[0] if row is not None else None


def admit(
    conn: Connection[Any],
    project_id: uuid.UUID,
    portfolio_id: uuid.UUID,
    number_id: uuid.UUID,
    contact_id: uuid.UUID,
    *,
    now: datetime,
) -> datetime | None:
    """A business-initiated conversation from ``number_id`` with ``contact_id``: None when it may open (a
    new recipient is counted), else when it may next try (the first hour that counts against the limit, or
    the number's share of it, has left the window)."""
    keys = {"project_id": project_id, "portfolio_id": portfolio_id, "contact_id": contact_id, "now": now}
    locked = conn.execute(QUERIES["lock_for_opening"], keys).fetchone()
    if locked is None:  # the portfolio was deleted meanwhile: nothing limits the number any more
        return None
    tier, numbers, known = locked
    limit = LIMITS[tier]
    if known or limit is None:
        return None
    params = keys | {"number_id": number_id}
    row = conn.execute(QUERIES["openings"], params).fetchone()
    assert row is not None  # an aggregate: one row
    total: int = row[0]
    mine: int = row[1]
    first_hour: datetime | None = row[2]
    my_first_hour: datetime | None = row[3]
    if total >= limit and first_hour is not None:
        return first_hour + _BUCKET_SPAN
    if mine >= math.ceil(limit / max(1, numbers)) and my_first_hour is not None:
        return my_first_hour + _BUCKET_SPAN
    conn.execute(QUERIES["record_opening"], params)
    return None
