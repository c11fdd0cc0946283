"""Ingress of campaigns: a released recipient enters the campaign's no-reply sequence."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.contracts.platform_events import CampaignRecipientReleased
from libs.common.followups import campaigns
from libs.common.ingress.apply import EventResult
from libs.common.platform import contacts


def recipient_released(
    conn: Connection[Any], project_id: uuid.UUID, event: CampaignRecipientReleased, now: datetime
) -> EventResult:
    """A campaign's released recipient enters its no-reply sequence; a refusal is the result's status."""
    contacts.lock_contact(conn, project_id, event.contact_id)
    enrollment, result = campaigns.release_recipient(
        conn, project_id, event.campaign_id, event.recipient_id, event.contact_id, now=now
    )
    return EventResult(
        type="campaign.recipient_released",
        applied=result == "enrolled",
        contact_id=event.contact_id,
        enrollment_id=enrollment.id if enrollment else None,
        status=result,
    )
