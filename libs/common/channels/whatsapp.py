"""The WhatsApp Cloud API (Meta's Graph API): sending, and reading its webhooks.

**Send**: ``POST {WHATSAPP_GRAPH_URL}/{phone-number-id}/messages`` with the number's access token
(``Authorization: Bearer``): a text (``type: text``), a media by link (``image`` / ``video`` / ``audio`` /
``document`` with ``link`` and, but for audio, the body as ``caption``), or an approved template
(``type: template``: ``name``, ``language.code``, the parameters as the body component's ``text``
parameters). Every message carries our id as ``biz_opaque_callback_data``, which Meta returns on each of
its statuses: an answer lost after sending is still reconciled by the status webhook. The answer
``messages[0].id`` (a ``wamid``) is the provider message id.

**Webhooks**: Meta signs the raw body with the app secret (``X-Hub-Signature-256: sha256=<hex>``), and
verifies the endpoint once with ``GET ?hub.mode=subscribe&hub.verify_token=...&hub.challenge=...``.
``entry[].changes[].value`` (``field: messages``) holds ``messages`` (a contact wrote) and ``statuses``
(``sent``, ``delivered``, ``read``, ``failed`` with ``errors[].code``) of the number whose
``metadata.phone_number_id`` it names; changes of another number are ignored.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

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

#: Graph error codes that mean "throttled, try later" (the request was not processed): application,
#: account and pair rate limits, spam rate limit, too many messages to one user.
THROTTLED: Final = frozenset({4, 80007, 130429, 131048, 131056})

#: What each webhook status becomes (others, ``deleted`` and ``warning``, are not a send's progress).
STATUSES: Final[dict[str, ReportedStatus]] = {
    "sent": "SENT",
    "delivered": "DELIVERED",
    "read": "READ",
    "failed": "FAILED",
}

#: The webhook message types whose text is the reply's body, and where it is.
_MEDIA = ("image", "video", "audio", "document")


class WhatsAppCloud:
    """The adapter of the WhatsApp Cloud API (:class:`libs.common.channels.providers.Adapter`)."""

    def request(
        self, settings: ChannelSettings, channel: Channel, message: ClaimedMessage, callback_url: str | None
    ) -> ProviderRequest:
        payload: dict[str, Any] = {
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": (message.phone or "").lstrip("+"),
            "biz_opaque_callback_data": str(message.id),
        }
        if message.template_name is not None:
            template: dict[str, Any] = {
                "name": message.template_name,
                "language": {"code": message.template_language or "en"},
            }
            if message.template_parameters:
                parameters = [{"type": "text", "text": p} for p in message.template_parameters]
                template["components"] = [{"type": "body", "parameters": parameters}]
            payload |= {"type": "template", "template": template}
        elif message.media_url is not None:
            kind = message.media_kind or "document"
            media: dict[str, Any] = {"link": message.media_url}
            if message.body and kind != "audio":
                media["caption"] = message.body
            payload |= {"type": kind, kind: media}
        else:
            payload |= {"type": "text", "text": {"preview_url": False, "body": message.body or ""}}
        return ProviderRequest(
            url=f"{settings.whatsapp_graph_url.rstrip('/')}/{channel.account_id}/messages",
            headers={"Authorization": f"Bearer {channel.secret('access_token')}"},
            json=payload,
        )

    def outcome(self, status_code: int, headers: Mapping[str, str], body: bytes) -> Outcome:
        answer = answer_json(body)
        if 200 <= status_code < 300:
            try:
                return Sent(str(answer["messages"][0]["id"]))
            except (KeyError, IndexError, TypeError):
                return Unconfirmed("bad_response")
        error = answer.get("error") if isinstance(answer, dict) else None
        if not isinstance(error, dict):
            return failure(status_code, headers, None, None, throttled=THROTTLED)
        text = str(error.get("message") or "")
        data = error.get("error_data")
        details = data.get("details") if isinstance(data, dict) else None
        text = f"{text} ({details})" if details else text
        return failure(status_code, headers, error.get("code"), text, throttled=THROTTLED)


def signature(app_secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` Meta sends with ``body``."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def verify(app_secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` signs ``body`` with the app secret (in constant time)."""
    return header is not None and hmac.compare_digest(signature(app_secret, body).encode(), header.encode())


def parse(channel: Channel, body: bytes, is_opt_out: Callable[[str], bool]) -> list[Parsed]:
    """The events of a webhook's body for this number (ValueError: not a webhook of Meta's shape)."""
    try:
        payload = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("entry"), list):
        raise ValueError("no entry list")
    found: list[Parsed] = []
    for entry in payload["entry"]:
        changes = (entry.get("changes") or []) if isinstance(entry, dict) else []
        for change in changes:
            value = change.get("value") if isinstance(change, dict) else None
            if not isinstance(value, dict) or change.get("field", "messages") != "messages":
                continue
            metadata = value.get("metadata") or {}
            if str(metadata.get("phone_number_id", channel.account_id)) != channel.account_id:
                continue  # another number of the same app: its own webhook URL gets it
            found += [_reply(m, is_opt_out) for m in value.get("messages") or [] if isinstance(m, dict)]
            found += [s for s in map(_status, value.get("statuses") or []) if s is not None]
    return found


def _reply(message: dict[str, Any], is_opt_out: Callable[[str], bool]) -> Reply:
    kind = message.get("type")
    content = message.get(kind) if isinstance(kind, str) else None
    content = content if isinstance(content, dict) else {}
    body: str | None = None
    if kind == "text":
        body = content.get("body")
    elif kind in _MEDIA:
        body = content.get("caption")
    elif kind == "button":
        body = content.get("text")
    elif kind == "interactive":
        chosen = content.get("button_reply") or content.get("list_reply") or {}
        body = chosen.get("title") if isinstance(chosen, dict) else None
    event = InboundMessage(
        provider_message_id=str(message.get("id", "")),
        phone="+" + str(message.get("from", "")).lstrip("+"),
        body=body if isinstance(body, str) else None,
        media_kind=kind if kind in _MEDIA else None,
    )
    return Reply(event=event, opt_out=isinstance(body, str) and is_opt_out(body))


def _status(status: Any) -> MessageStatus | None:
    if not isinstance(status, dict) or status.get("status") not in STATUSES:
        return None
    ours = status.get("biz_opaque_callback_data")
    message_id = _uuid(ours) if isinstance(ours, str) else None
    errors = status.get("errors") or []
    error = errors[0] if errors and isinstance(errors[0], dict) else {}
    failed = status["status"] == "failed"
    text = error.get("message") or error.get("title")
    return MessageStatus(
        status=STATUSES[status["status"]],
        message_id=message_id,
        provider_message_id=str(status.get("id")) if status.get("id") else None,
        error=clean(str(text)) if failed and text else ("failed" if failed else None),
        error_code=str(error["code"]) if failed and error.get("code") is not None else None,
    )


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
