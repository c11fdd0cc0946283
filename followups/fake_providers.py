"""Fake messaging providers for tests, benchmarks and ``followups dev --fake-provider``: real HTTP servers
on 127.0.0.1, each in a thread, speaking the provider's documented shapes.

:func:`fake_graph` is the WhatsApp Cloud API (``POST /<version>/<phone-number-id>/messages``, Bearer token;
answers ``{"messaging_product", "contacts", "messages": [{"id": "wamid..."}]}``, errors as Graph's
``{"error": {"message", "type", "code", "error_data", "fbtrace_id"}}``) and sends Meta's webhooks signed
with the app secret (``X-Hub-Signature-256``). :func:`fake_twilio` is Twilio's Messages API (``POST
/2010-04-01/Accounts/<sid>/Messages.json``, Basic auth, a form; answers 201 with ``sid``, errors as
``{"code", "message", "more_info", "status"}``) and sends Twilio's webhooks signed with the auth token
(``X-Twilio-Signature``).

How the next requests are answered is set per test (:attr:`FakeProvider.mode`, or a :meth:`script` of
modes taken one per request before it):

    accept      the provider takes the message (its id in the answer)
    throttle    429 with the provider's throttling code (and ``Retry-After: 0``)
    reject      400 with the provider's code of an unreachable recipient (131026, 63016)
    fail        500 (the message may or may not have gone: the send lane must not resend it)
    stall       waits ``stall_seconds`` (longer than the client's deadline), then answers
    drop        reads the request, records the message as taken, and closes the connection unanswered

(A provider that cannot be reached at all is a closed port: :func:`closed_port`.)

Every request takes ``latency`` seconds. Taken messages are in :attr:`FakeProvider.taken` (the decoded
request with the id given), and ``on_taken`` is called with each (dev logs what "reached the phone").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode

import httpx

Mode = Literal["accept", "throttle", "reject", "fail", "stall", "drop"]

#: The Graph API version the fake answers under (``WHATSAPP_GRAPH_URL`` is ``<url>/v21.0``).
GRAPH_VERSION = "v21.0"


@dataclass
class Taken:
    """A message the fake provider took: its id and the request (JSON, or the form as a dict)."""

    id: str
    request: dict[str, Any]
    account: str


@dataclass
class FakeProvider:
    url: str
    #: The token (Graph) or the auth token (Twilio) every request must carry.
    secret: str
    mode: Mode = "accept"
    latency: float = 0.0
    stall_seconds: float = 3.0
    taken: list[Taken] = field(default_factory=list)
    #: Requests received (every mode), in order.
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    on_taken: Callable[[Taken], None] | None = None
    #: How its webhooks are POSTed: ``poster(url, body, headers)`` (a test posts through its client).
    poster: Callable[[str, bytes, dict[str, str]], Any] = field(
        default=lambda url, body, headers: _post(url, body, headers)
    )
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    _script: list[Mode] = field(default_factory=list)

    def script(self, *modes: Mode) -> None:
        """Answer the next requests in these modes, one each, then in :attr:`mode` again."""
        with self.lock:
            self._script = list(modes)

    def next_mode(self) -> Mode:
        with self.lock:
            self.requests += 1
            return self._script.pop(0) if self._script else self.mode

    def take(self, request: dict[str, Any], account: str, prefix: str) -> Taken:
        taken = Taken(id=f"{prefix}{uuid.uuid4().hex}", request=request, account=account)
        with self.lock:
            self.taken.append(taken)
        if self.on_taken is not None:
            self.on_taken(taken)
        return taken

    def taken_ids(self) -> list[str]:
        with self.lock:
            return [t.id for t in self.taken]

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.stopping.wait(seconds)


@dataclass
class FakeGraph(FakeProvider):
    """The fake WhatsApp Cloud API; :meth:`webhook` sends Meta's webhooks to the engine."""

    #: The app secret its webhooks are signed with.
    app_secret: str = "fake-app-secret"

    @property
    def graph_url(self) -> str:
        """What ``WHATSAPP_GRAPH_URL`` is set to."""
        return f"{self.url}/{GRAPH_VERSION}"

    def answer(self, mode: Mode, path: str, headers: Any, raw: bytes) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != GRAPH_VERSION or parts[2] != "messages":
            return 404, _graph_error(f"Unknown path components: {path}", 2500)
        if headers.get("Authorization") != f"Bearer {self.secret}":
            return 401, _graph_error("Error validating access token", 190)
        try:
            body = json.loads(raw)
        except ValueError:
            return 400, _graph_error("Invalid JSON", 100)
        if body.get("messaging_product") != "whatsapp" or not body.get("to") or body.get("type") not in body:
            return 400, _graph_error("(#100) Invalid parameter", 100)
        if mode == "throttle":
            return 429, _graph_error("(#130429) Rate limit hit", 130429)
        if mode == "reject":
            return 400, _graph_error("(#131026) Message undeliverable", 131026, "Receiver is incapable")
        if mode == "fail":
            return 500, _graph_error("An unknown error occurred", 1)
        taken = self.take(body, parts[1], "wamid.")
        return 200, {
            "messaging_product": "whatsapp",
            "contacts": [{"input": body["to"], "wa_id": body["to"]}],
            "messages": [{"id": taken.id}],
        }

    def webhook(
        self, url: str, value: dict[str, Any], *, phone_number_id: str, secret: str | None = None
    ) -> Any:
        """POST one webhook change (``value``: its ``messages`` or ``statuses``) to ``url``, signed."""
        value = {"messaging_product": "whatsapp", "metadata": {"phone_number_id": phone_number_id}} | value
        payload = {
            "object": "whatsapp_business_account",
            "entry": [{"id": "0", "changes": [{"value": value, "field": "messages"}]}],
        }
        body = json.dumps(payload).encode()
        signature = (
            "sha256=" + hmac.new((secret or self.app_secret).encode(), body, hashlib.sha256).hexdigest()
        )
        headers = {"Content-Type": "application/json", "X-Hub-Signature-256": signature}
        return self.poster(url, body, headers)

    def status(self, url: str, taken: Taken, status: str, **error: Any) -> Any:
        """Meta's status webhook of a taken message (``sent``, ``delivered``, ``read``, ``failed``)."""
        entry: dict[str, Any] = {
            "id": taken.id,
            "status": status,
            "timestamp": str(int(time.time())),
            "recipient_id": taken.request.get("to"),
        }
        if "biz_opaque_callback_data" in taken.request:
            entry["biz_opaque_callback_data"] = taken.request["biz_opaque_callback_data"]
        if error:
            entry["errors"] = [error]
        return self.webhook(url, {"statuses": [entry]}, phone_number_id=taken.account)

    def reply(
        self, url: str, phone_number_id: str, from_phone: str, text: str, message_id: str | None = None
    ) -> Any:
        """Meta's webhook of a contact's text message."""
        message = {
            "from": from_phone.lstrip("+"),
            "id": message_id or f"wamid.{uuid.uuid4().hex}",
            "timestamp": str(int(time.time())),
            "type": "text",
            "text": {"body": text},
        }
        contact = {"profile": {"name": "Contact"}, "wa_id": from_phone.lstrip("+")}
        return self.webhook(
            url, {"contacts": [contact], "messages": [message]}, phone_number_id=phone_number_id
        )


def _post(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url, content=body, headers=headers, timeout=10)


def _graph_error(message: str, code: int, details: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {
        "message": message,
        "type": "OAuthException",
        "code": code,
        "fbtrace_id": "Afake",
    }
    if details:
        error["error_data"] = {"messaging_product": "whatsapp", "details": details}
    return {"error": error}


@dataclass
class FakeTwilio(FakeProvider):
    """The fake Twilio Messages API; :meth:`webhook` sends Twilio's webhooks to the engine."""

    account_sid: str = "AC" + "0" * 32

    def answer(self, mode: Mode, path: str, headers: Any, raw: bytes) -> tuple[int, dict[str, Any]]:
        prefix = f"/2010-04-01/Accounts/{self.account_sid}/Messages.json"
        if path != prefix:
            return 404, _twilio_error(20404, "The requested resource was not found", 404)
        expected = "Basic " + base64.b64encode(f"{self.account_sid}:{self.secret}".encode()).decode()
        if headers.get("Authorization") != expected:
            return 401, _twilio_error(20003, "Authenticate", 401)
        form = dict(parse_qsl(raw.decode(), keep_blank_values=True))
        if not form.get("To") or not (form.get("From") or form.get("MessagingServiceSid")):
            return 400, _twilio_error(21604, "A 'To' phone number is required.", 400)
        if not (form.get("Body") or form.get("MediaUrl") or form.get("ContentSid")):
            return 400, _twilio_error(21602, "Message body is required.", 400)
        if mode == "throttle":
            return 429, _twilio_error(20429, "Too Many Requests", 429)
        if mode == "reject":
            return 400, _twilio_error(63016, "Failed to send freeform message outside the window", 400)
        if mode == "fail":
            return 500, _twilio_error(20500, "Internal Server Error", 500)
        taken = self.take(form, self.account_sid, "SM")
        return 201, {"sid": taken.id, "status": "queued", "to": form["To"], "account_sid": self.account_sid}

    def webhook(self, url: str, params: dict[str, str], *, auth_token: str | None = None) -> Any:
        """POST a webhook form to ``url`` (query included), signed as Twilio signs it."""
        signed = url + "".join(k + params[k] for k in sorted(params))
        digest = hmac.new((auth_token or self.secret).encode(), signed.encode(), hashlib.sha1).digest()
        headers = {
            "X-Twilio-Signature": base64.b64encode(digest).decode(),
            "Content-Type": "application/x-www-form-urlencoded",
        }
        return self.poster(url, urlencode(params).encode(), headers)

    def status(self, taken: Taken, status: str, error_code: str | None = None) -> Any:
        """The status callback of a taken message, to the ``StatusCallback`` it was sent with."""
        params = {
            "MessageSid": taken.id,
            "MessageStatus": status,
            "AccountSid": self.account_sid,
            "To": taken.request["To"],
            "From": taken.request.get("From", ""),
        }
        if error_code:
            params["ErrorCode"] = error_code
        return self.webhook(taken.request["StatusCallback"], params)

    def reply(self, url: str, from_phone: str, to: str, text: str, sid: str | None = None) -> Any:
        """An incoming WhatsApp message."""
        params = {
            "MessageSid": sid or f"SM{uuid.uuid4().hex}",
            "SmsStatus": "received",
            "AccountSid": self.account_sid,
            "From": f"whatsapp:{from_phone}",
            "To": to,
            "Body": text,
            "NumMedia": "0",
        }
        return self.webhook(url, params)


def _twilio_error(code: int, message: str, status: int) -> dict[str, Any]:
    return {
        "code": code,
        "message": message,
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": status,
    }


def _handler(server: FakeGraph | FakeTwilio) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the real APIs (httpx reuses connections)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            mode = server.next_mode()
            with server.lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                server.sleep(server.latency)
                if mode == "stall":
                    server.sleep(server.stall_seconds)
                if mode == "drop":
                    server.answer("accept", self.path, self.headers, raw)  # it went out: the answer is lost
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status, payload = server.answer(mode, self.path, self.headers, raw)
            finally:
                with server.lock:
                    server.in_flight -= 1
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 429:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), BaseHTTPRequestHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (its deadline, a killed worker) leaves a broken pipe: expected


@contextmanager
def _serve(make: Callable[[str], FakeGraph | FakeTwilio]) -> Iterator[Any]:
    http = _Server()
    fake = make(f"http://127.0.0.1:{http.server_address[1]}")
    http.RequestHandlerClass = _handler(fake)
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.stopping.set()
        http.shutdown()
        http.server_close()
        thread.join(5)


@contextmanager
def fake_graph(
    access_token: str = "fake-access-token", app_secret: str = "fake-app-secret"
) -> Iterator[FakeGraph]:
    """A running fake WhatsApp Cloud API."""
    with _serve(lambda url: FakeGraph(url=url, secret=access_token, app_secret=app_secret)) as fake:
        yield fake


@contextmanager
def fake_twilio(
    auth_token: str = "fake-auth-token", account_sid: str = "AC" + "0" * 32
) -> Iterator[FakeTwilio]:
    """A running fake Twilio Messages API."""
    with _serve(lambda url: FakeTwilio(url=url, secret=auth_token, account_sid=account_sid)) as fake:
        yield fake


def closed_port() -> int:
    """A local port nothing listens on (a connection to it is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
