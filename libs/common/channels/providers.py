"""What the send lane asks a provider and what it makes of the answer, the same for every provider.

An adapter (:mod:`~libs.common.channels.whatsapp`, :mod:`~libs.common.channels.twilio`) builds the request
for one claimed message (:class:`ProviderRequest`) and reads the provider's answer into an
:class:`Outcome`; :class:`Providers` makes the call (one client per process, a deadline per attempt) and
classifies what went wrong on the wire:

    Sent(provider_message_id)  the provider took it: the message is SENT with the provider's id
    Retry(error)               it never reached the provider (no connection, refused, a DNS failure), or
                               the provider throttled it (429, a throttling code): sent again after a
                               backoff, within the message's lifetime
    Unconfirmed(error)         the request went out and its answer was lost (a timeout after sending, a
                               5xx, a connection cut, an answer we cannot read): never sent again; the
                               provider's status webhook (or a status query) settles it
    Rejected(code, error)      the provider refused it (a 4xx): FAILED, with the provider's code

Error classes are names (``connect_error``, ``timeout``, ``http_503``), never the provider's bytes; a
rejection keeps the provider's code and at most :data:`MAX_ERROR_LENGTH` characters of its message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import httpx

from libs.common.channels.setup import Channel
from libs.common.contracts.platform_events import InboundMessage, MessageStatus
from libs.common.core.settings import ChannelSettings
from libs.common.platform.send_lane import ClaimedMessage

log = logging.getLogger(__name__)

#: Longest error text kept from a provider's rejection.
MAX_ERROR_LENGTH: Final = 500
#: Largest answer read from a provider (an answer beyond it is not a send's answer).
MAX_ANSWER_BYTES: Final = 65_536


@dataclass(frozen=True)
class Sent:
    provider_message_id: str


@dataclass(frozen=True)
class Retry:
    error: str
    #: Seconds the provider asked to wait (``Retry-After``), when it said.
    retry_after: float | None = None


@dataclass(frozen=True)
class Unconfirmed:
    error: str


@dataclass(frozen=True)
class Rejected:
    code: str
    error: str


Outcome = Sent | Retry | Unconfirmed | Rejected


@dataclass(frozen=True)
class Reply:
    """A contact's message read from a webhook, and whether it is an opt-out (a keyword, or the
    provider's own opt-out flag)."""

    event: InboundMessage
    opt_out: bool


#: What a provider's webhook holds: replies and statuses.
Parsed = Reply | MessageStatus


@dataclass(frozen=True)
class ProviderRequest:
    """One POST to a provider: JSON (``json``) or a form (``form``)."""

    url: str
    headers: dict[str, str] = field(repr=False)
    json: dict[str, Any] | None = None
    form: list[tuple[str, str]] | None = None


class Adapter(Protocol):
    def request(
        self, settings: ChannelSettings, channel: Channel, message: ClaimedMessage, callback_url: str | None
    ) -> ProviderRequest: ...

    def outcome(self, status_code: int, headers: httpx.Headers, body: bytes) -> Outcome: ...


def clean(text: str) -> str:
    """Provider text as it may be stored: printable characters, at most :data:`MAX_ERROR_LENGTH`."""
    return "".join(c if c.isprintable() else "?" for c in text)[:MAX_ERROR_LENGTH]


def retry_after(headers: httpx.Headers) -> float | None:
    """The ``Retry-After`` seconds of an answer (a date form is ignored: the backoff applies)."""
    value = headers.get("retry-after", "")
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class Providers:
    """Sends claimed messages through their number's provider (thread-safe: one per process)."""

    def __init__(
        self,
        settings: ChannelSettings,
        adapters: dict[str, Adapter],
        *,
        callback_url: Callable[[Channel, ClaimedMessage], str | None] | None = None,
    ) -> None:
        self.settings = settings
        self.adapters = adapters
        self.callback_url = callback_url or (lambda channel, message: None)
        timeout = settings.timeout_seconds
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(5.0, timeout)),
            limits=httpx.Limits(
                max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency
            ),
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def send(self, channel: Channel, message: ClaimedMessage) -> Outcome:
        """One attempt, within ``SEND_LANE_TIMEOUT_SECONDS`` (the answer's body read within it too)."""
        adapter = self.adapters[channel.provider]
        request = adapter.request(self.settings, channel, message, self.callback_url(channel, message))
        deadline = time.monotonic() + self.settings.timeout_seconds
        try:
            with self._http.stream(
                "POST", request.url, headers=request.headers, json=request.json, data=_form(request.form)
            ) as response:
                body = b""
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        return Unconfirmed(f"http_{response.status_code}_too_long")
                    if time.monotonic() > deadline:
                        return Unconfirmed("timeout")
                return adapter.outcome(response.status_code, response.headers, body)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # no connection was made: the provider never saw the request
            return Retry("connect_timeout" if isinstance(exc, httpx.ConnectTimeout) else "connect_error")
        except httpx.TimeoutException:
            return Unconfirmed("timeout")
        except httpx.TransportError:
            return Unconfirmed("connection_lost")


def _form(form: list[tuple[str, str]] | None) -> Any:
    return None if form is None else _multi(form)


def _multi(form: list[tuple[str, str]]) -> dict[str, str | list[str]]:
    """A form with repeated keys as httpx takes it (a list of values)."""
    out: dict[str, str | list[str]] = {}
    for key, value in form:
        if key in out:
            previous = out[key]
            out[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            out[key] = value
    return out
