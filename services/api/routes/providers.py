"""Channels: a number's provider and credentials (write-only), and the providers' webhooks.

The webhooks (``/v1/providers/...``) take no API key: the provider signs each request, and the number's
credentials check the signature (:mod:`libs.common.channels.inbound`; a bad one is 401, nothing written).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any
from urllib.parse import parse_qsl

from litestar import Controller, MediaType, Request, Response, delete, get, post, put
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody, QueryParameter, RawBody

from libs.common.channels import inbound, setup
from libs.common.channels.inbound import WebhookResult
from libs.common.channels.setup import ChannelSetup, ChannelView
from services.api.deps import ProjectId, runtime_of, transaction
from services.api.scopes import provider_signed, scope

#: What a webhook answers when its signature does not verify (nothing is written).
_SIGNED = {
    401: ResponseSpec(None, description="The provider's signature does not verify: nothing was written.")
}

#: The answer Twilio expects to an incoming message it should not reply to.
_EMPTY_TWIML = '<?xml version="1.0" encoding="UTF-8"?><Response></Response>'


class ChannelsController(Controller):
    path = "/v1/numbers/{number_id:uuid}/channel"
    tags = ["numbers"]
    opt = scope("admin")

    @put("/", sync_to_thread=True)
    def set(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        number_id: FromPath[uuid.UUID],
        data: JSONBody[ChannelSetup],
    ) -> ChannelView:
        """Send this number's messages through a provider (``whatsapp_cloud`` or ``twilio``) with these
        credentials. The credentials are write-only: no answer shows them again (``credentials_set``
        names those set); the answer's ``webhook_path`` is where the provider must send its webhooks."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return setup.set_channel(conn, project_id, number_id, data, now=runtime.clock.now())

    @get("/", sync_to_thread=True, opt=scope("read"))
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, number_id: FromPath[uuid.UUID]
    ) -> ChannelView:
        with transaction(runtime_of(request)) as conn:
            return setup.get_channel(conn, project_id, number_id).view()

    @delete("/", sync_to_thread=True)
    def remove(
        self, request: Request[Any, Any, Any], project_id: ProjectId, number_id: FromPath[uuid.UUID]
    ) -> None:
        """Forget the number's channel and its credentials: the send lane no longer sends its messages."""
        with transaction(runtime_of(request)) as conn:
            setup.delete_channel(conn, project_id, number_id)


class ProviderWebhooksController(Controller):
    path = "/v1/providers"
    tags = ["provider webhooks"]
    opt = provider_signed()

    @get(
        "/whatsapp/{number_id:uuid}/webhook",
        sync_to_thread=True,
        media_type=MediaType.TEXT,
        responses={
            403: ResponseSpec(None, description="`hub.verify_token` is not the number's verify token.")
        },
    )
    def whatsapp_verify(
        self,
        request: Request[Any, Any, Any],
        number_id: FromPath[uuid.UUID],
        mode: Annotated[str, QueryParameter(name="hub.mode", max_length=64)] = "",
        token: Annotated[str, QueryParameter(name="hub.verify_token", max_length=512)] = "",
        challenge: Annotated[str, QueryParameter(name="hub.challenge", max_length=512)] = "",
    ) -> str:
        """Meta's check of the webhook URL: answers ``hub.challenge`` when ``hub.verify_token`` is the
        number's verify token (403 otherwise)."""
        return inbound.verify_subscription(runtime_of(request), number_id, mode, token, challenge)

    @post("/whatsapp/{number_id:uuid}/webhook", sync_to_thread=True, status_code=200, responses=_SIGNED)
    def whatsapp(
        self, request: Request[Any, Any, Any], number_id: FromPath[uuid.UUID], body: RawBody
    ) -> WebhookResult:
        """A WhatsApp Cloud API webhook (messages and statuses), signed with the app secret
        (``X-Hub-Signature-256``)."""
        runtime = runtime_of(request)
        signature = request.headers.get("x-hub-signature-256")
        return inbound.whatsapp_webhook(runtime, number_id, body, signature, now=runtime.clock.now())

    @post(
        "/twilio/{number_id:uuid}/webhook",
        sync_to_thread=True,
        status_code=200,
        responses=_SIGNED,
        media_type=MediaType.XML,
    )
    def twilio(
        self, request: Request[Any, Any, Any], number_id: FromPath[uuid.UUID], body: RawBody
    ) -> Response[str]:
        """A Twilio webhook (an incoming message or a status callback), signed with the auth token
        (``X-Twilio-Signature`` over the URL Twilio called and the form)."""
        runtime = runtime_of(request)
        public = runtime.settings.channels.public_url
        url = str(request.url)
        if public is not None:
            query = f"?{request.url.query}" if request.url.query else ""
            url = f"{public.rstrip('/')}{request.url.path}{query}"
        params = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        inbound.twilio_webhook(
            runtime,
            number_id,
            url,
            params,
            request.headers.get("x-twilio-signature"),
            message_id=request.query_params.get("message_id"),
            now=runtime.clock.now(),
        )
        return Response(_EMPTY_TWIML, media_type=MediaType.XML)
