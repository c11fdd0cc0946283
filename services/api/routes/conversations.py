"""Conversations: read one, and the follow-up shortcut."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody

from libs.common.followups.shortcut import FollowUpRequest, follow_up
from libs.common.followups.transitions import Enrollment
from libs.common.platform import conversations, messages
from libs.common.platform.messages import ConversationDetail
from libs.common.rules import executions
from libs.common.rules.executions import Execution, ExecutionStatus
from services.api.deps import PageLimit, ProjectId, page, runtime_of, transaction
from services.api.openapi import conflict
from services.api.routes import Page, as_page


class ConversationsController(Controller):
    path = "/v1/conversations"
    tags = ["conversations"]

    @get("/{conversation_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, conversation_id: FromPath[uuid.UUID]
    ) -> ConversationDetail:
        """The conversation with its last 20 messages, newest first (every one: ``GET
        /v1/messages?conversation_id=``)."""
        with transaction(runtime_of(request)) as conn:
            return messages.get_conversation_detail(conn, project_id, conversation_id)

    @get("/{conversation_id:uuid}/rule-executions", sync_to_thread=True)
    def rule_executions(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        conversation_id: FromPath[uuid.UUID],
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
        status: FromQuery[ExecutionStatus | None] = None,
    ) -> Page[Execution]:
        """The delayed rules pending, executed or skipped for this conversation, newest first."""
        with transaction(runtime_of(request)) as conn:
            conversations.get_conversation(conn, project_id, conversation_id)
            rows = executions.list_executions(
                conn, project_id, conversation_id=conversation_id, status=status, limit=limit + 1, after=after
            )
        return as_page(page(rows, limit))

    @post(
        "/{conversation_id:uuid}/follow-up",
        sync_to_thread=True,
        responses={200: ResponseSpec(Enrollment, description="The existing one-off for this `dedupe_key`.")}
        | conflict("The follow-up is refused; `code` says why (`opted_out`, `plan_limit`, ...)."),
    )
    def follow_up(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        conversation_id: FromPath[uuid.UUID],
        data: JSONBody[FollowUpRequest],
    ) -> Response[Enrollment]:
        """A one-off follow-up for the conversation's contact: after ``delay_seconds`` (default 24 h), send
        ``text``, unless the contact replied (``only_if_no_reply``, default true)."""
        runtime = runtime_of(request)
        now = runtime.clock.now()
        with transaction(runtime) as conn:
            enrollment, created = follow_up(conn, project_id, conversation_id, data, now=now)
        return Response(enrollment, status_code=201 if created else 200)
