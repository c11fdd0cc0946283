"""The send lane's claim (status reports go through ``POST /v1/events`` as ``message.status``)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.params import JSONBody

from libs.common.platform.send_lane import ClaimedMessage, ClaimRequest, claim_messages
from services.api.deps import ProjectId, runtime_of, transaction
from services.api.routes import Items, as_items
from services.api.scopes import scope


class SendLaneController(Controller):
    path = "/v1/send-lane"
    tags = ["send lane"]
    opt = scope("events")

    @post("/claim", sync_to_thread=True, status_code=200)
    def claim(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[ClaimRequest]
    ) -> Items[ClaimedMessage]:
        """Claim QUEUED messages (QUEUED to PROCESSING), in priority then age order; from now on a reply
        no longer cancels them."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return as_items(claim_messages(conn, project_id, data, now=runtime.clock.now()))
