"""Helpers shared by tests: worker processes and an events consumer bound to the topic exchange."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika


class Process:
    """A child process whose output lines are collected in a thread, so a test can wait for one."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.popen = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout as stream:
            for raw in stream:
                self.lines.append(raw.decode(errors="replace").rstrip())

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float = 30) -> str:
        """The first output line containing ``text``; fails if none comes within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.popen.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not printed within {timeout}s:\n{self.output}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig``, wait for the exit, and return the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f"process did not stop within {timeout}s:\n{self.output}") from None
        self._reader.join(5)
        return code


def followups(*args: str, env: dict[str, str]) -> Process:
    """``followups ARGS`` in a process of its own."""
    return Process([sys.executable, "-m", "followups", *args], os.environ | env)


def start_worker(service: str, env: dict[str, str]) -> Process:
    """``followups worker <service>`` in a process of its own."""
    return followups("worker", service, env={"LOG_JSON": "true", "WORKER_METRICS_PORT": "0"} | env)


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
