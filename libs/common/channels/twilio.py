"""Twilio's Messages API (a WhatsApp sender): sending, and reading its webhooks.

**Send**: ``POST {TWILIO_API_URL}/2010-04-01/Accounts/{AccountSid}/Messages.json``, Basic auth with the
account SID and auth token, a form: ``To=whatsapp:+E164``, ``From`` (the sender) or
``MessagingServiceSid`` (a ``MG...`` sender), then ``Body`` (and ``MediaUrl`` for a media), or a content
template: ``ContentSid`` (the message's ``template_name``, ``HX...``) with ``ContentVariables`` (the
parameters as ``{"1": ..., "2": ...}``). With ``PROVIDER_WEBHOOK_PUBLIC_URL`` set, ``StatusCallback`` is
the number's webhook with our message id in its query, so a status reconciles a message whose answer was
lost. The answer's ``sid`` (``SM...``) is the provider message id.

**Webhooks** (one URL for incoming messages and status callbacks): a form, signed as
``X-Twilio-Signature: base64(HMAC-SHA1(auth token, URL + each parameter's name and value, by name))``.
A status callback has ``MessageStatus`` (``sent``, ``delivered``, ``read``, ``failed`` and
``undelivered`` with ``ErrorCode``); an incoming message has ``Body``, ``From`` (``whatsapp:+E164``),
``NumMedia`` / ``MediaUrl0`` / ``MediaContentType0`` and, when Twilio's opt-out handling matched,
``OptOutType=STOP``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from collections.abc import Callable, Mapping
from typing import Final

import msgspec

from libs.common.channels.providers import (
    Outcome,
    Parsed,
    ProviderRequest,
    Reply,
    Sent,
    Unconfirmed,
    answer_json,
    clean,
    failure,
)
from libs.common.channels.setup import Channel
from libs.common.contracts.platform_events import InboundMessage, MessageStatus, ReportedStatus
from libs.common.core.settings import ChannelSettings
from libs.common.platform.send_lane import ClaimedMessage

#: Twilio's code of a throttled request (with HTTP 429).
THROTTLED: Final = frozenset({20429})

#: What each ``MessageStatus`` becomes (``queued``, ``accepted``, ``sending``, ``scheduled`` are not news).
STATUSES: Final[dict[str, ReportedStatus]] = {
    "sent": "SENT",
    "delivered": "DELIVERED",
    "read": "READ",
    "failed": "FAILED",
    "undelivered": "FAILED",
    "canceled": "FAILED",
}

#: A media's content type's prefix, and the media kind it is.
_MEDIA_KINDS: Final = {"image/": "image", "video/": "video", "audio/": "audio"}


class TwilioMessages:
    """The adapter of Twilio's Messages API (:class:`libs.common.channels.providers.Adapter`)."""

    def request(
        self, settings: ChannelSettings, channel: Channel, message: ClaimedMessage, callback_url: str | None
    ) -> ProviderRequest:
        sender = channel.sender or ""
        form = [("To", f"whatsapp:{message.phone}")]
        form.append(("MessagingServiceSid", sender) if sender.startswith("MG") else ("From", sender))
        if message.template_name is not None:
            variables = {str(i): p for i, p in enumerate(message.template_parameters or [], start=1)}
            form += [("ContentSid", message.template_name)]
            if variables:
                form += [("ContentVariables", msgspec.json.encode(variables).decode())]
        else:
            if message.body:
                form.append(("Body", message.body))
            if message.media_url is not None:
                form.append(("MediaUrl", message.media_url))
        if callback_url is not None:
            form.append(("StatusCallback", callback_url))
        token = base64.b64encode(f"{channel.account_id}:{channel.secret('auth_token')}".encode()).decode()
        return ProviderRequest(
            url=f"{settings.twilio_api_url.rstrip('/')}/2010-04-01/Accounts/{channel.account_id}/Messages.json",
            headers={"Authorization": f"Basic {token}"},
            form=form,
        )

    def outcome(self, status_code: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        answer = answer_json(body)
        if 200 <= status_code < 300:
            sid = answer.get("sid") if isinstance(answer, dict) else None
            return Sent(str(sid)) if sid else Unconfirmed("bad_response")
        if not isinstance(answer, dict):
            return failure(status_code, headers, None, None, throttled=THROTTLED)
        text = str(answer.get("message") or "")
        return failure(status_code, headers, answer.get("code"), text, throttled=THROTTLED)


def signature(auth_token: str, url: str, params: list[tuple[str, str]]) -> str:
    """The ``X-Twilio-Signature`` of a POST to ``url`` with ``params`` (as Twilio's own helper computes
    it: each name once, in order, then its values in order)."""
    signed = url
    for name in sorted({n for n, _ in params}):
        for value in sorted({v for n, v in params if n == name}):
            signed += name + value
    digest = hmac.new(auth_token.encode(), signed.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def verify(auth_token: str, url: str, params: list[tuple[str, str]], header: str | None) -> bool:
    """Whether ``header`` signs the POST (in constant time)."""
    if header is None:
        return False
    return hmac.compare_digest(signature(auth_token, url, params).encode(), header.strip().encode())


def parse(
    channel: Channel, params: list[tuple[str, str]], message_id: str | None, is_opt_out: Callable[[str], bool]
) -> list[Parsed]:
    """The event of a webhook's form (``message_id``: ours, from the status callback's query)."""
    form = dict(params)
    if form.get("AccountSid") not in (None, channel.account_id):
        return []  # another account's: not this number's
    sid = form.get("MessageSid") or form.get("SmsSid")
    status = form.get("MessageStatus") or form.get("SmsStatus")
    if status is not None and status != "received":
        if status not in STATUSES:
            return []
        failed = STATUSES[status] == "FAILED"
        return [
            MessageStatus(
                status=STATUSES[status],
                message_id=_uuid(message_id),
                provider_message_id=sid,
                error=clean(form.get("ErrorMessage") or status) if failed else None,
                error_code=(form.get("ErrorCode") or status) if failed else None,
            )
        ]
    if not sid:
        raise ValueError("no MessageSid")
    body = form.get("Body")
    media_kind = None
    if form.get("NumMedia", "0") not in ("", "0"):
        content_type = form.get("MediaContentType0", "")
        media_kind = next((k for p, k in _MEDIA_KINDS.items() if content_type.startswith(p)), "document")
    event = InboundMessage(
        provider_message_id=sid,
        phone=form.get("From", "").removeprefix("whatsapp:"),
        body=body or None,
        media_url=form.get("MediaUrl0") if media_kind else None,
        media_kind=media_kind,  # type: ignore[arg-type]
    )
    opt_out = form.get("OptOutType", "").upper() == "STOP" or (body is not None and is_opt_out(body))
    return [Reply(event=event, opt_out=opt_out)]


def _uuid(text: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(text) if text else None
    except ValueError:
        return None
