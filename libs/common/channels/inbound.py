"""The providers' webhooks: checked by their signature, then turned into the platform events every other
path produces, applied in the request's own transaction (an error rolls all of them back and the provider
retries: nothing is lost, and a repeat changes nothing):

    a contact's message      message.inbound (idempotent by the provider's message id: a repeat is not
                             applied twice), which stops the contact's follow-ups on reply
    an opt-out keyword       then contact.opted_out (:data:`OPT_OUT_KEYWORDS`, or Twilio's OptOutType=STOP)
    a status                 message.status SENT / DELIVERED / READ / FAILED (with the provider's code),
                             by our id (WhatsApp's biz_opaque_callback_data, Twilio's callback query) or
                             the provider's; monotonic, so a repeat or a late one changes nothing; a send
                             waiting for its lost answer is settled by it (:func:`send_lane.reconcile`)

A webhook whose signature does not verify is :class:`~libs.common.core.errors.Unauthorized` (401) before
anything is written. A status of a message the project does not know (one another system sent from the
same number) is counted as ignored, not an error.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from datetime import datetime
from typing import Any, Final

import msgspec

from libs.common.channels import twilio, whatsapp
from libs.common.channels.providers import Parsed, Reply
from libs.common.channels.send_lane import reconcile
from libs.common.channels.setup import Channel, Provider, channel_of_webhook
from libs.common.contracts.platform_events import ContactOptedOut
from libs.common.core import effects
from libs.common.core.db import map_errors
from libs.common.core.errors import DatabaseUnavailable, Forbidden, InvalidInput, NotFound, Unauthorized
from libs.common.core.metrics import PROVIDER_WEBHOOKS
from libs.common.core.runtime import Runtime
from libs.common.ingress import apply_event, stop_after_unapplied_reply

log = logging.getLogger(__name__)

#: A contact's whole message that opts them out (case, spaces and a final ``.`` or ``!`` aside).
OPT_OUT_KEYWORDS: Final = frozenset({"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "OPTOUT"})


def is_opt_out(body: str) -> bool:
    return body.strip().rstrip(".!").strip().upper() in OPT_OUT_KEYWORDS


class WebhookResult(msgspec.Struct, kw_only=True):
    """What a webhook request came to."""

    #: Events applied (a reply, a status, an opt-out).
    applied: int = 0
    #: Events already applied before (a repeated delivery): nothing changed.
    repeated: int = 0
    #: Events not for this project (a status of a message it does not know) or not valid: skipped.
    ignored: int = 0


def _channel(runtime: Runtime, number_id: uuid.UUID, provider: Provider) -> Channel:
    with map_errors(), runtime.pool.connection() as conn:
        channel = channel_of_webhook(conn, number_id)
    if channel is None or channel.provider != provider:
        PROVIDER_WEBHOOKS.labels(provider, "unknown_number").inc()
        raise NotFound("no number has this webhook", field="number_id")
    return channel


def verify_subscription(runtime: Runtime, number_id: uuid.UUID, mode: str, token: str, challenge: str) -> str:
    """Meta's endpoint check (``hub.mode=subscribe``): the challenge back when the verify token matches."""
    channel = _channel(runtime, number_id, "whatsapp_cloud")
    expected = channel.secret("verify_token").encode()
    if mode != "subscribe" or not hmac.compare_digest(expected, token.encode()):
        PROVIDER_WEBHOOKS.labels("whatsapp_cloud", "verify_refused").inc()
        raise Forbidden("the verify token does not match", field="hub.verify_token")
    PROVIDER_WEBHOOKS.labels("whatsapp_cloud", "verified").inc()
    return challenge


def whatsapp_webhook(
    runtime: Runtime, number_id: uuid.UUID, body: bytes, signature: str | None, *, now: datetime
) -> WebhookResult:
    """A WhatsApp Cloud API webhook (``X-Hub-Signature-256`` over the raw body)."""
    channel = _channel(runtime, number_id, "whatsapp_cloud")
    if not whatsapp.verify(channel.secret("app_secret"), body, signature):
        _refused(channel, "X-Hub-Signature-256")
    try:
        parsed = whatsapp.parse(channel, body, is_opt_out)
    except ValueError as exc:
        PROVIDER_WEBHOOKS.labels(channel.provider, "invalid").inc()
        raise InvalidInput(f"not a WhatsApp webhook: {exc}", field="body") from None
    return _apply(runtime, channel, parsed, now)


def twilio_webhook(
    runtime: Runtime,
    number_id: uuid.UUID,
    url: str,
    params: list[tuple[str, str]],
    signature: str | None,
    *,
    message_id: str | None,
    now: datetime,
) -> WebhookResult:
    """A Twilio webhook (incoming message or status callback), ``X-Twilio-Signature`` over ``url`` (as
    Twilio called it, query included) and the form's parameters."""
    channel = _channel(runtime, number_id, "twilio")
    if not twilio.verify(channel.secret("auth_token"), url, params, signature):
        _refused(channel, "X-Twilio-Signature")
    try:
        parsed = twilio.parse(channel, params, message_id, is_opt_out)
    except ValueError as exc:
        PROVIDER_WEBHOOKS.labels(channel.provider, "invalid").inc()
        raise InvalidInput(f"not a Twilio webhook: {exc}", field="body") from None
    return _apply(runtime, channel, parsed, now)


def _refused(channel: Channel, header: str) -> None:
    PROVIDER_WEBHOOKS.labels(channel.provider, "bad_signature").inc()
    log.warning(
        "provider webhook refused: bad signature",
        extra={"project_id": str(channel.project_id), "number_id": str(channel.number_id), "header": header},
    )
    raise Unauthorized(f"the {header} signature does not verify")


def _apply(runtime: Runtime, channel: Channel, parsed: list[Parsed], now: datetime) -> WebhookResult:
    result = WebhookResult()
    project_id = channel.project_id
    try:
        with map_errors(), effects.transaction(runtime) as conn:
            for item in parsed:
                try:
                    with effects.savepoint(conn):
                        _apply_one(conn, project_id, item, result, now)
                except (NotFound, InvalidInput) as exc:
                    result.ignored += 1
                    log.info(
                        "provider webhook event ignored",
                        extra={
                            "project_id": str(project_id),
                            "number_id": str(channel.number_id),
                            "reason": exc.message,
                            "provider_message_id": _provider_id(item),
                        },
                    )
    except DatabaseUnavailable:
        raise  # the provider retries the webhook
    except Exception as exc:
        for item in parsed:
            if isinstance(item, Reply):
                stop_after_unapplied_reply(runtime.pool, project_id, item.event, exc, now=now)
        raise
    PROVIDER_WEBHOOKS.labels(channel.provider, "applied").inc()
    log.info(
        "provider webhook",
        extra={"project_id": str(project_id), "number_id": str(channel.number_id)}
        | msgspec.structs.asdict(result),
    )
    return result


def _apply_one(conn: Any, project_id: uuid.UUID, item: Parsed, result: WebhookResult, now: datetime) -> None:
    if isinstance(item, Reply):
        applied = apply_event(conn, project_id, item.event, now=now)
        if not applied.applied:
            result.repeated += 1
            return
        result.applied += 1
        if item.opt_out and applied.contact_id is not None:
            apply_event(conn, project_id, ContactOptedOut(contact_id=applied.contact_id), now=now)
            result.applied += 1
        return
    status = apply_event(conn, project_id, item, now=now)
    if status.message_id is not None:
        reconcile(conn, project_id, [status.message_id])
    if status.applied:
        result.applied += 1
    else:
        result.repeated += 1


def _provider_id(item: Parsed) -> str | None:
    return item.event.provider_message_id if isinstance(item, Reply) else item.provider_message_id
