"""The action that POSTs the event to a URL (a delivery of :mod:`libs.common.rules.webhooks`)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from psycopg import Connection

from libs.common.contracts.limits import MediaUrl
from libs.common.rules import webhooks
from libs.common.rules.actions.base import BaseAction, Done, Subject, executed_by, form


class SendWebhook(BaseAction, kw_only=True, tag="send_webhook"):
    """POST the event as JSON to ``url``, signed (HMAC-SHA256), retried with backoff until delivered."""

    url: Annotated[MediaUrl, form("URL (http or https)")]

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        webhooks.validate_url(self.url, field=f"{where}.url")

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> None:
        payload = {
            "event": subject.type,
            "rule_id": str(rule_id),
            "trigger_id": str(subject.trigger_public_id),
            "project_id": str(subject.project_id),
            "contact_id": str(subject.contact_id),
            "conversation_id": str(subject.conversation_id) if subject.conversation_id else None,
            "occurred_at": subject.occurred_at.isoformat(),
            "data": subject.payload,
            "executed_by": executed_by(rule_id),
        }
        delivery_id = webhooks.queue_delivery(
            conn,
            subject.project_id,
            rule_id=rule_id,
            trigger_id=subject.trigger_public_id,
            url=self.url,
            payload=payload,
            now=now,
        )
        done.webhook_delivery_ids.append(delivery_id)
