"""The parts of the chaos run (:mod:`benchmarks.chaos`) that stand for what is outside the product: the
receiver of webhooks, a consumer of the events on a quorum queue, the messaging platform publishing to the
ingress queue, a replica's process, and the clients calling both API processes."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pika

from benchmarks.rabbitmq_cluster import free_port

EVENTS_EXCHANGE = "followups.events"
EVENTS_QUEUE = "chaos-events"


# --- the receiver of webhooks --------------------------------------------------------------------------


class Receiver(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        #: How often each delivery id arrived.
        self.deliveries: collections.Counter[str] = collections.Counter()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.deliveries[self.headers.get("X-Followups-Delivery") or ""] += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


# --- the events, as a consumer of a quorum queue sees them ---------------------------------------------


class EventsQueue(threading.Thread):
    """A quorum queue bound to every event, consumed from a live node (another when its node dies)."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True, name="chaos-events")
        self.urls = urls
        self.received: collections.Counter[str] = collections.Counter()
        self.last_at = time.monotonic()
        self.stopping = threading.Event()
        self.declared = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            for url in random.sample(self.urls, len(self.urls)):
                with contextlib.suppress(Exception):
                    self._consume(url)
                if self.stopping.is_set():
                    return
            time.sleep(0.5)

    def _consume(self, url: str) -> None:
        parameters = pika.URLParameters(url)
        parameters.heartbeat = 5
        parameters.blocked_connection_timeout = 5
        connection = pika.BlockingConnection(parameters)
        try:
            channel = connection.channel()
            channel.exchange_declare(EVENTS_EXCHANGE, exchange_type="topic", durable=True)
            channel.queue_declare(EVENTS_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
            channel.queue_bind(EVENTS_QUEUE, EVENTS_EXCHANGE, routing_key="#")
            channel.basic_qos(prefetch_count=200)
            self.declared.set()
            for method, _props, body in channel.consume(EVENTS_QUEUE, inactivity_timeout=0.5):
                if self.stopping.is_set():
                    return
                if method is None:
                    continue
                self.received[str(json.loads(body)["id"])] += 1
                self.last_at = time.monotonic()
                channel.basic_ack(method.delivery_tag)
        finally:
            with contextlib.suppress(Exception):
                connection.close()


# --- actor messages, as the messaging platform publishes them ----------------------------------------


class Publisher:
    """Dramatiq actor messages published to a service's queue on a live node, each confirmed by the broker
    (mandatory: a queue not declared yet is an error, not a message dropped); a node that fails is left for
    the next."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.lock = threading.Lock()
        self.channel: Any = None
        self.connection: pika.BlockingConnection | None = None

    def send(self, queue: str, actor: str, args: list[Any], deadline_s: float = 60) -> None:
        body = json.dumps(
            {
                "queue_name": queue,
                "actor_name": actor,
                "args": args,
                "kwargs": {},
                "options": {},
                "message_id": str(uuid.uuid4()),
                "message_timestamp": int(time.time() * 1000),
            }
        ).encode()
        properties = pika.BasicProperties(delivery_mode=2, content_type="application/json")
        deadline = time.monotonic() + deadline_s
        with self.lock:
            while True:
                try:
                    channel = self.channel or self._connect()
                    channel.basic_publish("", queue, body, properties, mandatory=True)
                    return
                except Exception as exc:
                    self.close()
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{queue} {actor}: not published within {deadline_s}s") from exc
                    time.sleep(0.3)

    def _connect(self) -> Any:
        for url in random.sample(self.urls, len(self.urls)):
            with contextlib.suppress(Exception):
                parameters = pika.URLParameters(url)
                parameters.heartbeat = 5
                parameters.blocked_connection_timeout = 5
                parameters.socket_timeout = 5
                self.connection = pika.BlockingConnection(parameters)
                self.channel = self.connection.channel()
                self.channel.confirm_delivery()
                return self.channel
        raise RuntimeError("no RabbitMQ node answers")

    def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(Exception):
                self.connection.close()
        self.connection = self.channel = None


# --- the replicas ----------------------------------------------------------------------------------------


class Replica:
    def __init__(self, service: str, index: int, env: dict[str, str], logs: Path) -> None:
        self.service, self.index, self.env, self.logs = service, index, env, logs
        self.port = free_port() if service == "api" else 0
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}"

    def start(self) -> None:
        args = ["api", "--host", "127.0.0.1", "--port", str(self.port)]
        if self.service != "api":
            args = ["worker", self.service]
        self.starts += 1
        with open(self.logs / f"{self.name}.log", "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "followups", *args],
                env=os.environ | self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def tail(self, lines: int = 5) -> str:
        """The last lines of the replica's log."""
        path = self.logs / f"{self.name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def kill(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
            self.process = None


# --- the API, through both processes ---------------------------------------------------------------------


class Api:
    """Requests through the API processes in turn; a dropped connection or a 503 goes to the next one."""

    def __init__(self, ports: list[int], key: str) -> None:
        self.bases = [f"http://127.0.0.1:{port}" for port in ports]
        self.headers = {"Authorization": f"Bearer {key}"}
        self.lock = threading.Lock()
        self.turn = 0
        self.requests = 0
        self.retried = 0
        self.unavailable = 0
        self.other_5xx: list[str] = []

    def call(self, method: str, path: str, body: Any = None, deadline_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + deadline_s
        with self.lock:
            self.turn += 1
            turn = self.turn
            self.requests += 1
        while True:
            base = self.bases[turn % len(self.bases)]
            turn += 1
            try:
                answer = httpx.request(method, base + path, json=body, headers=self.headers, timeout=10)
            except httpx.HTTPError:
                answer = None
            if answer is not None and answer.status_code < 500:
                if answer.status_code >= 400:
                    raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text[:300]}")
                loaded = answer.json() if answer.content else {}
                return loaded if isinstance(loaded, dict) else {"items": loaded}
            if answer is not None:
                if answer.status_code == 503 and answer.headers.get("Retry-After"):
                    with self.lock:
                        self.unavailable += 1
                else:
                    with self.lock:
                        self.other_5xx.append(f"{method} {path}: {answer.status_code} {answer.text[:300]}")
            with self.lock:
                self.retried += 1
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: no answer within {deadline_s}s")
            time.sleep(0.2)


def healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
