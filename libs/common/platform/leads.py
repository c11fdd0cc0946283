"""Leads and deals: a lead's status (open, or closed as won / lost / closed) and a deal's stage."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.core.errors import AlreadyExists, NotFound
from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.platform", "leads.sql")


def create_lead(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    lead_id: uuid.UUID,
    status: str,
    *,
    now: datetime,
) -> bool:
    """Create a lead for a contact (the caller locked the contact); False when it exists already.

    A repeat is fine; a lead id held by another contact or project is a conflict.
    """
    params = {"project_id": project_id, "id": lead_id, "contact_id": contact_id, "status": status, "now": now}
    if conn.execute(QUERIES["insert_lead"], params).fetchone() is not None:
        return True
    holder = conn.execute(QUERIES["lead_contact"], params).fetchone()
    if holder is None or holder[0] != contact_id:
        raise AlreadyExists("a lead with this id exists", field="lead_id")
    return False


def lead_contact(conn: Connection[Any], project_id: uuid.UUID, lead_id: uuid.UUID) -> uuid.UUID:
    """The contact a lead of the project belongs to (404 for an unknown lead)."""
    row = conn.execute(QUERIES["lead_contact"], {"project_id": project_id, "id": lead_id}).fetchone()
    if row is None:
        raise NotFound("lead not found", field="lead_id")
    contact_id: uuid.UUID = row[0]
    return contact_id


@dataclass(frozen=True)
class LeadChange:
    """What a lead status event did: whether it changed anything, and whether it closed an open lead."""

    applied: bool
    closed_now: bool
    #: The status before.
    previous: str


def set_lead_status(
    conn: Connection[Any],
    project_id: uuid.UUID,
    lead_id: uuid.UUID,
    status: str,
    *,
    closed: bool,
    now: datetime,
) -> LeadChange:
    """A lead's new status (the caller locked its contact, so lead events apply one at a time).

    A close applies to an open lead (or changes how it closed); another status applies when it differs,
    and reopens a closed lead. A repeat changes nothing.
    """
    params = {"project_id": project_id, "id": lead_id}
    current = conn.execute(QUERIES["lock_lead"], params).fetchone()
    assert current is not None  # leads are deleted only with their contact, which is locked
    previous, was_closed = current
    applied = previous != status or (closed and not was_closed)
    if applied:
        conn.execute(QUERIES["set_lead_status"], params | {"status": status, "closed": closed, "now": now})
    return LeadChange(applied=applied, closed_now=applied and closed and not was_closed, previous=previous)


def set_deal_stage(
    conn: Connection[Any],
    project_id: uuid.UUID,
    deal_id: uuid.UUID,
    stage: str,
    *,
    contact_id: uuid.UUID | None,
    lead_id: uuid.UUID | None,
    now: datetime,
) -> tuple[uuid.UUID, str | None]:
    """A deal's new stage, creating the deal when ``contact_id`` is given; returns the deal's contact and
    its stage before (None for a new deal)."""
    params = {
        "project_id": project_id,
        "id": deal_id,
        "contact_id": contact_id,
        "lead_id": lead_id,
        "stage": stage,
        "now": now,
    }
    if lead_id is not None and conn.execute(QUERIES["lead_exists"], params).fetchone() is None:
        raise NotFound("lead not found", field="lead_id")
    row = conn.execute(QUERIES["set_deal_stage"], params).fetchone()
    if row is None and contact_id is not None:
        row = conn.execute(QUERIES["insert_deal"], params).fetchone()
    if row is None:
        raise NotFound("deal not found; give contact_id to create it", field="contact_id")
    return row[0], row[1]
