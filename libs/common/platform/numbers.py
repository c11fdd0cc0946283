"""Sending numbers (WhatsApp instances): register, read, list, rename, make the project's default, and
their status (``connected`` | ``disconnected``), which the platform reports with ``number.connected`` /
``number.disconnected`` events. One default number per project."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.contracts.limits import Name, Phone
from libs.common.core import validation
from libs.common.core.db import map_errors
from libs.common.core.errors import AlreadyExists, NotFound
from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.platform", "numbers.sql")

NumberStatus = Literal["connected", "disconnected"]


class NumberCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    phone: Phone
    name: Name | None = None
    is_default: bool = False
    status: NumberStatus = "connected"
    #: The business portfolio whose messaging limit it shares (``/v1/portfolios``).
    portfolio_id: uuid.UUID | None = None


class NumberUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A partial update: absent fields are kept."""

    name: Name | msgspec.UnsetType | None = msgspec.UNSET
    is_default: bool | msgspec.UnsetType = msgspec.UNSET
    status: NumberStatus | msgspec.UnsetType = msgspec.UNSET
    #: Its portfolio (null: none).
    portfolio_id: uuid.UUID | msgspec.UnsetType | None = msgspec.UNSET


class Number(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    phone: str
    name: str | None
    status: str
    is_default: bool
    portfolio_id: uuid.UUID | None = None
    created_at: datetime
    updated_at: datetime


_CONSTRAINTS = {
    "numbers_project_phone_key": lambda: AlreadyExists("a number with this phone exists", field="phone"),
    "numbers_portfolio_fkey": lambda: NotFound("portfolio not found", field="portfolio_id"),
}


def _name(name: str | None) -> str | None:
    if name is None:
        return None
    return validation.name(name)


def create_number(
    conn: Connection[Any], project_id: uuid.UUID, data: NumberCreate, *, now: datetime
) -> Number:
    params = {
        "project_id": project_id,
        "phone": validation.phone(data.phone),
        "name": _name(data.name),
        "status": data.status,
        "portfolio_id": data.portfolio_id,
        "now": now,
    }
    with map_errors(_CONSTRAINTS), conn.cursor(row_factory=class_row(Number)) as cur:
        number = cur.execute(QUERIES["insert_number"], params).fetchone()
    assert number is not None
    if data.is_default:
        return update_number(conn, project_id, number.id, NumberUpdate(is_default=True), now=now)
    return number


def get_number(
    conn: Connection[Any], project_id: uuid.UUID, number_id: uuid.UUID, *, lock: bool = False
) -> Number:
    """One number of the project (404 for an unknown one, or another project's)."""
    with conn.cursor(row_factory=class_row(Number)) as cur:
        query = QUERIES["lock_number" if lock else "get_number"]
        number = cur.execute(query, {"project_id": project_id, "id": number_id}).fetchone()
    if number is None:
        raise NotFound("number not found", field="number_id")
    return number


def list_numbers(
    conn: Connection[Any], project_id: uuid.UUID, *, limit: int, after: uuid.UUID | None = None
) -> list[Number]:
    with conn.cursor(row_factory=class_row(Number)) as cur:
        params = {"project_id": project_id, "limit": limit, "after": after}
        return cur.execute(QUERIES["list_numbers"], params).fetchall()


def update_number(
    conn: Connection[Any], project_id: uuid.UUID, number_id: uuid.UUID, data: NumberUpdate, *, now: datetime
) -> Number:
    """Rename, make (or unmake) the default, or set the status; the number is locked first."""
    current = get_number(conn, project_id, number_id, lock=True)
    is_default = current.is_default if isinstance(data.is_default, msgspec.UnsetType) else data.is_default
    params = {
        "project_id": project_id,
        "id": number_id,
        "name": current.name if isinstance(data.name, msgspec.UnsetType) else _name(data.name),
        "is_default": is_default,
        "status": current.status if isinstance(data.status, msgspec.UnsetType) else data.status,
        "portfolio_id": (
            current.portfolio_id if isinstance(data.portfolio_id, msgspec.UnsetType) else data.portfolio_id
        ),
        "now": now,
    }
    if is_default and not current.is_default:
        conn.execute(QUERIES["clear_default"], params)
    with map_errors(_CONSTRAINTS), conn.cursor(row_factory=class_row(Number)) as cur:
        number = cur.execute(QUERIES["update_number"], params).fetchone()
    assert number is not None
    return number


def set_number_status(
    conn: Connection[Any], project_id: uuid.UUID, number_id: uuid.UUID, status: NumberStatus, *, now: datetime
) -> tuple[Number, str]:
    """A number's new status (a platform event); returns it and its status before."""
    previous = get_number(conn, project_id, number_id, lock=True).status
    return update_number(conn, project_id, number_id, NumberUpdate(status=status), now=now), previous
