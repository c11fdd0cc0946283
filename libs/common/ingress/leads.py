"""Ingress of leads and deals: a lead created, its status changed or closed (which stops on a closed lead),
a deal's stage changed."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.contracts.platform_events import DealStageChanged, LeadClosed, LeadCreated, LeadStatusChanged
from libs.common.ingress.apply import EventResult, record, stop
from libs.common.platform import contacts, leads


def lead_created(
    conn: Connection[Any], project_id: uuid.UUID, event: LeadCreated, now: datetime
) -> EventResult:
    contacts.lock_contact(conn, project_id, event.contact_id)
    lead_id = event.lead_id or uuid.uuid4()
    applied = leads.create_lead(conn, project_id, event.contact_id, lead_id, event.status, now=now)
    result = EventResult(
        type="lead.created",
        applied=applied,
        contact_id=event.contact_id,
        lead_id=lead_id,
        status=event.status,
    )
    if applied:
        record(
            conn,
            project_id,
            "lead.created",
            result,
            now,
            contact_id=event.contact_id,
            lead_id=str(lead_id),
            status=event.status,
        )
    return result


def lead_status(
    conn: Connection[Any], project_id: uuid.UUID, event: LeadStatusChanged | LeadClosed, now: datetime
) -> EventResult:
    """A lead's new status; the lead-closed stop path runs when the lead goes from open to closed.

    A repeated event changes nothing (applied false) and stops nothing: follow-ups started after the lead
    closed are not stopped by a late duplicate of the close.
    """
    closed = isinstance(event, LeadClosed)
    contact_id = leads.lead_contact(conn, project_id, event.lead_id)
    contacts.lock_contact(conn, project_id, contact_id)
    change = leads.set_lead_status(conn, project_id, event.lead_id, event.status, closed=closed, now=now)
    result = EventResult(
        type="lead.closed" if closed else "lead.status_changed",
        applied=change.applied,
        contact_id=contact_id,
        lead_id=event.lead_id,
        status=event.status,
    )
    if change.applied and change.previous != event.status:
        record(
            conn,
            project_id,
            "lead.status_changed",
            result,
            now,
            contact_id=contact_id,
            lead_id=str(event.lead_id),
            status=event.status,
            changed={"lead.status": {"from": change.previous, "to": event.status}},
        )
    if change.closed_now:
        return stop(conn, project_id, contact_id, "lead_closed", now, result)
    return result


def deal_stage(
    conn: Connection[Any], project_id: uuid.UUID, event: DealStageChanged, now: datetime
) -> EventResult:
    contact_id, previous = leads.set_deal_stage(
        conn,
        project_id,
        event.deal_id,
        event.stage,
        contact_id=event.contact_id,
        lead_id=event.lead_id,
        now=now,
    )
    result = EventResult(
        type="deal.stage_changed", contact_id=contact_id, deal_id=event.deal_id, status=event.stage
    )
    if previous != event.stage:
        record(
            conn,
            project_id,
            "deal.stage_changed",
            result,
            now,
            contact_id=contact_id,
            deal_id=str(event.deal_id),
            stage=event.stage,
            lead_id=str(event.lead_id) if event.lead_id else None,
            changed={"deal.stage": {"from": previous, "to": event.stage}},
        )
    return result
