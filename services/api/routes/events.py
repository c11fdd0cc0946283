"""Platform events over REST: the same function the ingress actor calls."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from libs.common.contracts.platform_events import PlatformEvent
from libs.common.ingress import EventResult, handle_event
from services.api.deps import ProjectId, runtime_of
from services.api.openapi import conflict, not_found
from services.api.scopes import scope

#: Events that create something: 201 the first time, 200 when repeated.
_CREATING = {"message.inbound", "message.human", "lead.created", "conversation.created"}


class EventsController(Controller):
    path = "/v1/events"
    tags = ["platform events"]
    opt = scope("events")

    @post(
        "/",
        sync_to_thread=True,
        responses={
            200: ResponseSpec(
                EventResult, description="Applied, or already applied (`applied` false): nothing new created."
            )
        }
        | not_found(
            "A contact, conversation, message, lead, deal, number or campaign the event names is unknown."
        )
        | conflict("The event would create what exists (a lead or conversation id that is taken)."),
    )
    def apply(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[PlatformEvent]
    ) -> Response[EventResult]:
        """Apply one platform event (a reply, an opt-out, a status report, ...) and its stop paths."""
        runtime = runtime_of(request)
        result = handle_event(runtime, project_id, data, now=runtime.clock.now())
        created = result.applied and result.type in _CREATING
        return Response(result, status_code=201 if created else 200)
