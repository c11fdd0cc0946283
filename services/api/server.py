"""How the API is served: uvicorn over h11, with a deadline for a request's headers and one for its body.

uvicorn closes a connection idle *between* requests (``timeout_keep_alive``), but waits without end for a
request that has begun: a client sending half a header, or half a body, one byte now and then, holds its
connection (and, for a body, the handler awaiting it) for as long as it likes. :class:`DeadlineProtocol`
(uvicorn's h11 protocol) arms a timer on each connection:

- the **header deadline** runs from the connection's opening, and again from each response it finishes,
  until the next request's headers are complete; when it passes the connection is closed (nothing has
  been asked that an answer could go to);
- the **body deadline** runs from a request's headers until its body is complete; when it passes, a
  ``408`` problem is answered when no response has started (and the connection closed in any case). The
  handler still waiting for the body sees the client gone.

Both are per connection, in the event loop; the limits of whole processes (connections, rates) are the
reverse proxy's (docs/operations.md, Limits). :func:`config` builds the uvicorn configuration that the CLI
and ``followups dev`` run; it also decides whose ``X-Forwarded-For`` names the client
(``API_TRUSTED_PROXIES``: by default a proxy on the same host, as uvicorn's own default; ``none``: nobody).
"""

from __future__ import annotations

import asyncio
import json
import signal
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from libs.common.core.settings import ApiSettings
from services.api.problems import PROBLEM_JSON, problem_body


class ServerConfig(uvicorn.Config):
    """uvicorn's configuration, with the API's two deadlines (seconds)."""

    def __init__(self, app: Any, *, header_timeout: float, body_timeout: float, **options: Any) -> None:
        super().__init__(app, http=DeadlineProtocol, **options)
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout


def config(app: Any, settings: ApiSettings, *, host: str, port: int, **options: Any) -> ServerConfig:
    """The uvicorn configuration of the API ``app`` under ``settings`` (deadlines, trusted proxies)."""
    proxies = [p.strip() for p in settings.trusted_proxies.split(",") if p.strip()]
    trusted = proxies not in ([], ["none"])
    return ServerConfig(
        app,
        host=host,
        port=port,
        header_timeout=settings.header_timeout_seconds,
        body_timeout=settings.body_timeout_seconds,
        proxy_headers=trusted,
        forwarded_allow_ips=proxies if trusted else None,
        ws="none",  # no route is a WebSocket: an upgrade request is answered as plain HTTP
        log_config=None,
        **options,
    )


#: The answer to a body that did not arrive in time.
_TIMEOUT_DETAIL = "the request body did not arrive within the body deadline"


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with the header and body deadlines of :class:`ServerConfig` (see module)."""

    _deadline: asyncio.TimerHandle | None = None
    #: What the armed deadline waits for: a request's ``headers`` or its ``body`` (None: nothing).
    _awaiting: str | None = None

    def _deadlines(self) -> tuple[float, float]:
        own = self.config
        if isinstance(own, ServerConfig):
            return own.header_timeout, own.body_timeout
        return 0.0, 0.0  # a plain uvicorn.Config: no deadlines

    def _arm(self, awaiting: str) -> None:
        self._disarm()
        header_timeout, body_timeout = self._deadlines()
        seconds = header_timeout if awaiting == "headers" else body_timeout
        if seconds > 0:
            late = self._headers_late if awaiting == "headers" else self._body_late
            self._deadline, self._awaiting = self.loop.call_later(seconds, late), awaiting

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._awaiting = None, None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _sending_body(self) -> bool:
        """The client is still sending the current request's body (h11's view of it)."""
        return self.conn.their_state is h11.SEND_BODY

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and cycle is not before:  # a request's headers are complete
            if self._sending_body():
                self._arm("body")
            else:
                self._disarm()
        elif self._awaiting == "body" and not self._sending_body():
            # the body is complete: the handler takes the time it needs; if it has answered already
            # (before reading the body), the next request's headers are awaited
            if cycle is not None and cycle.response_complete:
                self._arm("headers")
            else:
                self._disarm()

    def on_response_complete(self) -> None:
        if not self._sending_body():  # else the body deadline still runs
            self._arm("headers")
        super().on_response_complete()

    def _headers_late(self) -> None:
        self._deadline, self._awaiting = None, None
        if not self.transport.is_closing():
            self.logger.info("connection closed: request headers late", extra={"client": self.client})
            self.transport.close()

    def _body_late(self) -> None:
        self._deadline, self._awaiting = None, None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not self._sending_body():
            return
        self.logger.info("connection closed: request body late", extra={"client": self.client})
        if not cycle.response_started:
            body = json.dumps(problem_body(408, _TIMEOUT_DETAIL)).encode()
            headers = [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            try:
                data = self.conn.send(
                    h11.Response(status_code=408, headers=headers, reason=b"Request Timeout")
                )
                data = (data or b"") + (self.conn.send(h11.Data(data=body)) or b"")
                data += self.conn.send(h11.EndOfMessage()) or b""
            except h11.LocalProtocolError:
                data = b""
            self.transport.write(data)
        # the handler waiting for the body sees the client gone; whatever it answers is dropped
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()


def stop_on_signals(server: uvicorn.Server) -> None:
    """Ctrl-C and SIGTERM stop uvicorn, and then the caller's clean-up (pool, workers, embedded database).

    uvicorn puts back the handlers it found and sends the signal again once it has stopped: these, not
    Python's defaults (KeyboardInterrupt, or death by SIGTERM without clean-up and an exit code of -15).
    """

    def stop(signum: int, frame: FrameType | None) -> None:
        server.should_exit = True

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
