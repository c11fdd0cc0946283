"""What the send lane asks a provider and what it makes of the answer, the same for every provider.

An adapter (:mod:`~libs.common.channels.whatsapp`, :mod:`~libs.common.channels.twilio`) builds the request
for one claimed message (:class:`ProviderRequest`) and reads the provider's answer into an
:class:`Outcome`; :class:`Providers` makes the call (one asynchronous HTTP session per process, on an event
loop of its own, a deadline per attempt) and classifies what went wrong on the wire:

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

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import aiohttp
import msgspec

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

    def outcome(self, status_code: int, headers: Mapping[str, str], body: bytes) -> Outcome: ...


def clean(text: str) -> str:
    """Provider text as it may be stored: printable characters, at most :data:`MAX_ERROR_LENGTH`."""
    return "".join(c if c.isprintable() else "?" for c in text)[:MAX_ERROR_LENGTH]


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The ``Retry-After`` seconds of an answer (a date form is ignored: the backoff applies)."""
    value = headers.get("retry-after", "")
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def answer_json(body: bytes) -> Any:
    """A provider's answer decoded (``{}`` when empty), None when it is not JSON."""
    try:
        return msgspec.json.decode(body) if body else {}
    except msgspec.DecodeError:
        return None


def failure(
    status_code: int, headers: Mapping[str, str], code: Any, error: str | None, *, throttled: frozenset[int]
) -> Outcome:
    """What a provider's answer other than a 2xx comes to, given the provider's ``code`` and ``error`` text
    read from it (``error`` None: the answer is not the provider's error shape): a 429 or a ``throttled``
    code is a :class:`Retry` (after its ``Retry-After``); a 5xx, or an answer not the provider's, is
    :class:`Unconfirmed`; any other is :class:`Rejected` with the provider's code (``http_<status>``
    without one)."""
    if status_code == 429 or (isinstance(code, int) and code in throttled):
        return Retry(f"throttled_{code}" if code is not None else "http_429", retry_after(headers))
    if status_code >= 500 or error is None:
        return Unconfirmed(f"http_{status_code}")
    return Rejected(code=str(code) if code is not None else f"http_{status_code}", error=clean(error))


class Providers:
    """Sends claimed messages through their number's provider: one aiohttp session per process, on an
    event loop of its own (one thread, every request in flight on it). :meth:`send` is thread-safe.

    Why aiohttp, not httpx: at 64 requests in flight httpx's asynchronous pool checks each of its
    connections at every request's start and end; against the fake Graph API (20 ms) it cost 6.2 ms of
    CPU a request in one pool, 1.4 ms over eight, aiohttp's 0.33 ms (``make bench-send-lane``, the
    send lane's CPU a message, is the figure to watch)."""

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
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="providers", daemon=True)
        self._thread.start()
        self._http = asyncio.run_coroutine_threadsafe(self._session(), self._loop).result()

    async def _session(self) -> aiohttp.ClientSession:
        timeout = self.settings.timeout_seconds
        return aiohttp.ClientSession(
            # a connection (the pool's wait for one included) within the deadline, made within 5 s;
            # then each read of the answer within the deadline (and the whole body by it: _send)
            timeout=aiohttp.ClientTimeout(
                total=None, connect=timeout, sock_connect=min(5.0, timeout), sock_read=timeout
            ),
            connector=aiohttp.TCPConnector(limit=self.settings.concurrency, limit_per_host=0),
            json_serialize=lambda payload: msgspec.json.encode(payload).decode(),
            auto_decompress=False,
            trust_env=False,
        )

    def close(self) -> None:
        """Close the session, then the event loop."""
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._http.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def send(self, channel: Channel, message: ClaimedMessage) -> Future[Outcome]:
        """Start one attempt; its outcome comes within ``SEND_LANE_TIMEOUT_SECONDS`` (the answer's body
        read within it too). The future's callbacks run on the event loop's thread: keep them short."""
        return asyncio.run_coroutine_threadsafe(self._send(channel, message), self._loop)

    async def _send(self, channel: Channel, message: ClaimedMessage) -> Outcome:
        adapter = self.adapters[channel.provider]
        request = adapter.request(self.settings, channel, message, self.callback_url(channel, message))
        deadline = time.monotonic() + self.settings.timeout_seconds
        try:
            async with self._http.post(
                request.url,
                headers=request.headers,
                json=request.json,
                data=request.form,
                allow_redirects=False,
            ) as response:
                body = b""
                async for chunk in response.content.iter_any():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        return Unconfirmed(f"http_{response.status}_too_long")
                    if time.monotonic() > deadline:
                        return Unconfirmed("timeout")
                return adapter.outcome(response.status, response.headers, body)
        except aiohttp.ConnectionTimeoutError:  # no connection was made: the provider never saw it
            return Retry("connect_timeout")
        except aiohttp.ClientConnectorError:
            return Retry("connect_error")
        except (aiohttp.ServerTimeoutError, TimeoutError):
            return Unconfirmed("timeout")
        except aiohttp.ClientError:
            return Unconfirmed("connection_lost")
