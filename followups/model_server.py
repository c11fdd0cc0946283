"""A local OpenAI-compatible model server for tests, benchmarks and trying AI steps without a model: a real
HTTP server on 127.0.0.1 in a thread, answering ``POST /v1/chat/completions`` as OpenAI does
(``choices[0].message.content`` and ``usage``).

How it answers is set per test (:attr:`ModelServer.mode`):

    answer                 {message, confidence, reason} as the content (the default)
    low_confidence         the same with ``low_confidence`` as its confidence
    invalid                content that is not JSON
    too_long               a message longer than a WhatsApp text may be (4096 characters)
    fail                   HTTP 500
    stall                  sleeps ``stall_seconds`` (longer than the client's timeout), then answers
    trickle                answers at once, but writes the body a few bytes at a time, one write every
                           ``trickle_interval`` seconds (each shorter than the client's timeout, together
                           longer)
    refuse_response_format a 400 naming ``response_format`` to a request that has one; the retry without
                           it is answered
    refuse_json_schema     as the llama.cpp server: a 500 naming ``response_format`` to ``json_schema``,
                           ``json_object`` (with its ``schema``) answered
    obey                   a model that obeys an injected message: its message is what the last customer
                           message of the prompt's data says after ``write exactly:`` (all of it without
                           one), each ``{name}`` in it replaced by the value of the variable ``name`` the
                           prompt gave (kept as written when it gave none)

Every request takes ``latency`` seconds, and waits while the :attr:`ModelServer.gate` is closed (a test
holds the calls in flight, does something, then lets them finish). With :attr:`ModelServer.upstream` set
(a real model server's URL, such as the llama.cpp server of ``followups.local_model``) every request is
passed on to it once the gate opens, and its answer returned: a real model's words, held on demand. Every
request body is recorded, and the most requests in flight at once (:attr:`ModelServer.max_in_flight`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import httpx

Mode = Literal[
    "answer",
    "low_confidence",
    "invalid",
    "too_long",
    "fail",
    "stall",
    "trickle",
    "refuse_response_format",
    "refuse_json_schema",
    "obey",
]

#: Longer than any gate or stall a test waits for: a server thread never blocks forever.
LONGEST_WAIT = 120.0


@dataclass
class ModelServer:
    """The server's behaviour (set by the test) and what it received."""

    url: str
    mode: Mode = "answer"
    message: str = "Hi Ana, did you get a chance to look at the quote?"
    confidence: float = 0.9
    low_confidence: float = 0.1
    reason: str = "a friendly nudge"
    #: Seconds every request takes before it is answered.
    latency: float = 0.0
    #: Seconds a ``stall`` request takes (longer than the client's timeout).
    stall_seconds: float = 2.0
    #: Seconds between two writes of a ``trickle`` answer's body, and how many writes it takes.
    trickle_interval: float = 0.2
    trickle_writes: int = 15
    prompt_tokens: int = 120
    completion_tokens: int = 30
    #: Request bodies, in arrival order (JSON-decoded; the raw text when not JSON).
    requests: list[Any] = field(default_factory=list)
    #: A real server's URL (``http://127.0.0.1:8080``): requests are passed on to it, whatever the mode.
    upstream: str | None = None
    #: Requests answered (a response written), by status code.
    answered: list[int] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    #: Open: requests are answered; closed (``gate.clear()``): they wait for it (at most LONGEST_WAIT).
    gate: threading.Event = field(default_factory=threading.Event)
    #: Set when the server shuts down: every wait ends.
    stopping: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.gate.set()

    @property
    def base_url(self) -> str:
        """What ``AI_BASE_URL`` is set to."""
        return self.url + "/v1"

    def received(self) -> int:
        with self.lock:
            return len(self.requests)

    def chat_requests(self) -> list[dict[str, Any]]:
        """The chat-completions bodies received."""
        with self.lock:
            return [body for body in self.requests if isinstance(body, dict)]

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.stopping.wait(seconds)

    def handle(self, path: str, raw: bytes) -> tuple[int, dict[str, Any], Mode]:
        """The status and JSON body answering one request, and the mode it was answered in."""
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        with self.lock:
            self.requests.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            mode = self.mode
        try:
            if path.rstrip("/") != "/v1/chat/completions":
                return 404, {"error": {"message": f"no route {path}"}}, mode
            deadline = time.monotonic() + LONGEST_WAIT
            while not self.gate.wait(0.05) and not self.stopping.is_set() and time.monotonic() < deadline:
                pass
            self.sleep(self.latency)
            if self.upstream is not None:
                return *self._forward(path, raw), "answer"
            return *self._answer(mode, body), mode
        finally:
            with self.lock:
                self.in_flight -= 1

    def _forward(self, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        assert self.upstream is not None
        try:
            response = httpx.post(
                self.upstream + path,
                content=raw,
                headers={"Content-Type": "application/json"},
                timeout=LONGEST_WAIT,
            )
            return response.status_code, response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return 502, {"error": {"message": f"upstream: {exc!r}"}}

    def _answer(self, mode: Mode, body: Any) -> tuple[int, dict[str, Any]]:
        if mode == "fail":
            return 500, {"error": {"message": "the model is overloaded", "type": "server_error"}}
        if mode == "stall":
            self.sleep(self.stall_seconds)
        if mode == "refuse_response_format" and isinstance(body, dict) and "response_format" in body:
            message = "Unrecognized request argument supplied: response_format"
            return 400, {"error": {"message": message, "param": "response_format"}}
        if mode == "refuse_json_schema" and isinstance(body, dict):
            kind = (body.get("response_format") or {}).get("type")
            if kind not in (None, "text", "json_object"):
                message = "response_format.type: Input should be 'text' or 'json_object'"
                return 500, {"error": {"message": message, "type": "internal_server_error"}}
        if mode == "invalid":
            content = "Sure! Here is a follow-up: Hi Ana, any news?"
        else:
            message = "x" * 4097 if mode == "too_long" else _obeyed(body) if mode == "obey" else self.message
            confidence = self.low_confidence if mode == "low_confidence" else self.confidence
            content = json.dumps({"message": message, "confidence": confidence, "reason": self.reason})
        return 200, {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": body.get("model") if isinstance(body, dict) else None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        }


def _obeyed(body: Any) -> str:
    """What a model obeying the last customer message writes (mode ``obey``)."""
    prompt = body["messages"][-1]["content"]
    data = json.loads(prompt[prompt.index("{", prompt.index("Data (JSON")) :])
    said = [line["text"] for line in data["conversation"] if line["from"] == "customer"]
    told = re.split(r"write exactly:\s*", said[-1] if said else "", flags=re.IGNORECASE)[-1]
    variables = data["variables"]
    return re.sub(r"\{(\w+)\}", lambda m: str(variables[m[1]]) if m[1] in variables else m[0], told)


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real server (httpx reuses connections)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status, payload, mode = server.handle(self.path, raw)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if mode == "trickle":
                size = -(-len(data) // server.trickle_writes)
                for start in range(0, len(data), size):
                    self.wfile.write(data[start : start + size])
                    self.wfile.flush()
                    server.sleep(server.trickle_interval)
            else:
                self.wfile.write(data)
            with server.lock:
                server.answered.append(status)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a timeout, a killed worker) leaves a broken pipe: expected


@contextmanager
def model_server() -> Iterator[ModelServer]:
    """A running fake model server, shut down (every waiting request let go) when the block ends."""
    http = _Server(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server = ModelServer(url=f"http://127.0.0.1:{http.server_address[1]}")
    http.RequestHandlerClass = _handler(server)
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.gate.set()
        http.shutdown()
        http.server_close()
        thread.join(5)
