"""Helpers shared by tests: worker processes and an events consumer bound to the topic exchange."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika


def start_worker(service: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``followups worker <service>`` in a process of its own."""
    full_env = os.environ | {"LOG_JSON": "true", "WORKER_METRICS_PORT": "0"} | env
    return subprocess.Popen(
        [sys.executable, "-m", "followups", "worker", service],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def stop_process(process: subprocess.Popen[bytes], timeout: float = 20) -> tuple[int, str]:
    """SIGTERM, wait, and return the exit code and everything it printed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        printed = output.decode(errors="replace")
        raise AssertionError(f"process did not stop within {timeout}s:\n{printed}") from None
    return process.returncode, output.decode(errors="replace")


class EventsConsumer:
    """A queue of our own bound to the events exchange, as the send lane or analytics would bind."""

    def __init__(self, amqp_url: str, exchange: str, binding_keys: tuple[str, ...] = ("#",)) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        self.channel = self.connection.channel()
        self.channel.exchange_declare(exchange, exchange_type="topic", durable=True)
        result = self.channel.queue_declare(
            f"test-events-{uuid.uuid4().hex[:8]}", exclusive=True, auto_delete=True
        )
        self.queue = result.method.queue
        for key in binding_keys:
            self.channel.queue_bind(self.queue, exchange, routing_key=key)
        self.received: list[tuple[str, dict[str, Any]]] = []

    def wait_for(
        self, predicate: Callable[[str, dict[str, Any]], bool], timeout: float = 30
    ) -> dict[str, Any]:
        """Consume until an event matches ``predicate``; returns its envelope."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            method, _props, body = self.channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                self.connection.sleep(0.1)
                continue
            envelope = json.loads(body)
            self.received.append((method.routing_key, envelope))
            if predicate(method.routing_key, envelope):
                return dict(envelope)
        raise AssertionError(f"no matching event within {timeout}s; received {self.received}")

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()
