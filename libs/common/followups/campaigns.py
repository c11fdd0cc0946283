"""Campaigns: each released recipient of a campaign is enrolled in the campaign's no-reply sequence
(seed 000's campaign releaser), once per (campaign, recipient), in a savepoint: a refusal is counted
(``whatstig_followup_enrollments_total{source="campaign",result}``), never an error for the campaign."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from typing import Any

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.contracts.limits import Name
from libs.common.core import effects, validation
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.core.sql import load_queries
from libs.common.followups.enrollments import EnrollmentRejected, EnrollRequest, enroll
from libs.common.followups.sequences import get_sequence
from libs.common.followups.transitions import Enrollment

QUERIES = load_queries("libs.common.followups", "campaigns.sql")


class CampaignPut(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    sequence_id: uuid.UUID
    name: Name | None = None


class Campaign(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID
    name: str | None
    created_at: datetime
    updated_at: datetime


def put_campaign(
    conn: Connection[Any], project_id: uuid.UUID, campaign_id: uuid.UUID, data: CampaignPut, *, now: datetime
) -> Campaign:
    """Set the campaign's no-reply sequence (the project's own)."""
    try:
        get_sequence(conn, project_id, data.sequence_id)
    except NotFound:
        raise NotFound("sequence not found", field="sequence_id") from None
    if data.name is not None and not 1 <= len(validation.text(data.name.strip(), "name")) <= 200:
        raise InvalidInput("name must be 1 to 200 characters", field="name")
    params = {
        "id": campaign_id,
        "project_id": project_id,
        "sequence_id": data.sequence_id,
        "name": data.name.strip() if data.name else None,
        "now": now,
    }
    with conn.cursor(row_factory=class_row(Campaign)) as cur:
        campaign = cur.execute(QUERIES["put_campaign"], params).fetchone()
    assert campaign is not None
    return campaign


def get_campaign(conn: Connection[Any], project_id: uuid.UUID, campaign_id: uuid.UUID) -> Campaign:
    with conn.cursor(row_factory=class_row(Campaign)) as cur:
        found = cur.execute(QUERIES["get_campaign"], {"project_id": project_id, "id": campaign_id}).fetchone()
    if found is None:
        raise NotFound("campaign not found", field="campaign_id")
    return found


def campaign_names(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """The name of each of the project's named campaigns in ``ids``, in one query (a page's rows)."""
    rows = conn.execute(QUERIES["campaign_names"], {"project_id": project_id, "ids": list(set(ids))})
    return {row[0]: row[1] for row in rows}


def release_recipient(
    conn: Connection[Any],
    project_id: uuid.UUID,
    campaign_id: uuid.UUID,
    recipient_id: str,
    contact_id: uuid.UUID,
    *,
    now: datetime,
) -> tuple[Enrollment | None, str]:
    """Enroll a released recipient in the campaign's sequence (in a savepoint); returns the enrollment and
    the result: ``enrolled``, ``deduplicated`` (released before), or the refusal's code."""
    campaign = get_campaign(conn, project_id, campaign_id)
    if not 1 <= len(validation.text(recipient_id, "recipient_id")) <= 200:
        raise InvalidInput("recipient_id must be 1 to 200 characters", field="recipient_id")
    request = EnrollRequest(
        contact_id=contact_id,
        sequence_id=campaign.sequence_id,
        # the recipient id hashed: a dedupe key stays short whatever the platform's ids are like
        dedupe_key=f"campaign:{campaign_id}:{hashlib.sha256(recipient_id.encode()).hexdigest()[:40]}",
        variables={"campaign_id": str(campaign_id)},
    )
    try:
        with effects.savepoint(conn):
            enrollment, created = enroll(
                conn, project_id, request, now=now, source="campaign", campaign_id=campaign_id
            )
    except EnrollmentRejected as refusal:
        return None, refusal.code or "rejected"
    return enrollment, "enrolled" if created else "deduplicated"
