"""Messages: list (every filter the project may want) and read one with its status history."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, get
from litestar.params import FromPath, FromQuery

from libs.common.platform import messages
from libs.common.platform.messages import Message, MessageDetail, MessageFilters, MessageSource, MessageStatus
from services.api.deps import PageLimit, ProjectId, QueryTime, page, query_time, runtime_of, transaction
from services.api.routes import Page, as_page


class MessagesController(Controller):
    path = "/v1/messages"
    tags = ["messages"]

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
        contact_id: FromQuery[uuid.UUID | None] = None,
        conversation_id: FromQuery[uuid.UUID | None] = None,
        enrollment_id: FromQuery[uuid.UUID | None] = None,
        rule_id: FromQuery[uuid.UUID | None] = None,
        sequence_id: FromQuery[uuid.UUID | None] = None,
        campaign_id: FromQuery[uuid.UUID | None] = None,
        source: FromQuery[MessageSource | None] = None,
        status: FromQuery[MessageStatus | None] = None,
        created_after: QueryTime = None,
        created_before: QueryTime = None,
    ) -> Page[Message]:
        """The project's messages, inbound and outbound, newest first; each names what sent it
        (``origin``). ``created_after`` is inclusive, ``created_before`` exclusive."""
        filters = MessageFilters(
            contact_id=contact_id,
            conversation_id=conversation_id,
            enrollment_id=enrollment_id,
            rule_id=rule_id,
            sequence_id=sequence_id,
            campaign_id=campaign_id,
            source=source,
            status=status,
            created_after=query_time(created_after, "created_after"),
            created_before=query_time(created_before, "created_before"),
        )
        with transaction(runtime_of(request)) as conn:
            rows = messages.list_messages(conn, project_id, filters, limit=limit + 1, after=after)
        return as_page(page(rows, limit))

    @get("/{message_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, message_id: FromPath[uuid.UUID]
    ) -> MessageDetail:
        """The message with its status history, oldest first (queued, claimed, sent, delivered, read, or
        failed or cancelled, as the send lane reported them)."""
        with transaction(runtime_of(request)) as conn:
            return messages.get_message(conn, project_id, message_id)
