"""Helpers shared by tests: waiting on a condition, reading rows, counting a connection's round trips,
Dramatiq workers on the StubBroker, worker processes, an events consumer bound to the topic exchange, and
the ingress actors on the StubBroker."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import dramatiq
import pika
import psycopg
from dramatiq.brokers.stub import StubBroker
from psycopg.pq import Trace
from psycopg_pool import ConnectionPool

from libs.common.contracts import actors
from libs.common.core.runtime import Runtime
from services.api.ingress import build as build_ingress

T = TypeVar("T")

#: How long (ms) an idle Dramatiq worker or consumer thread blocks on its queue before it looks again
#: whether it should stop. Dramatiq's default (1 s) makes every ``Worker.stop()`` take ~2 s: the worker
#: threads and then the consumer threads each finish their current wait. It is not a deadline for any work.
STUB_WORKER_TIMEOUT_MS = 50


def wait_until(predicate: Callable[[], T], timeout: float = 10, interval: float = 0.02, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; fail after ``timeout`` s.

    For a test that waits for something to happen (a row to appear, a thread to block): it goes on as soon
    as it has, instead of sleeping a fixed time and hoping it has by then."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what or 'condition'} not met within {timeout}s (last: {value!r})")
        time.sleep(interval)


def rows(pool: ConnectionPool, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Every row ``sql`` returns, run on a connection of ``pool`` (its own transaction)."""
    with pool.connection() as conn:
        return conn.execute(sql, params).fetchall()


class RoundTrips:
    """The round trips a connection makes inside a ``with`` block, from libpq's trace of it (a round trip:
    the client's messages, then the server's answers): :attr:`count` once the block ended."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.count = -1
        self._trace = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed at the block's end

    def __enter__(self) -> RoundTrips:
        self.conn.pgconn.trace(self._trace.fileno())
        self.conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.pgconn.untrace()
        os.fsync(self._trace.fileno())
        self._trace.seek(0)
        directions = [d for line in self._trace if (d := line.split("\t", 1)[0]) in ("F", "B")]
        self._trace.close()
        self.count = sum(1 for pair in itertools.pairwise(directions) if pair == ("F", "B"))


def stub_worker(broker: dramatiq.Broker, queues: Iterable[str], threads: int = 1) -> dramatiq.Worker:
    """A Dramatiq worker for a test's broker that stops promptly (see ``STUB_WORKER_TIMEOUT_MS``)."""
    return dramatiq.Worker(
        broker, queues=set(queues), worker_threads=threads, worker_timeout=STUB_WORKER_TIMEOUT_MS
    )


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

    def send(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` unless the process has exited."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def wait_exit(self, timeout: float = 30) -> int:
        """Wait for the exit (killing the process if it does not come) and return the exit code."""
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f"process did not stop within {timeout}s:\n{self.output}") from None
        self._reader.join(5)
        return code

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig``, wait for the exit, and return the exit code."""
        self.send(sig)
        return self.wait_exit(timeout)


def stop_all(processes: list[Process], sig: int = signal.SIGTERM, timeout: float = 30) -> list[int]:
    """Stop ``processes`` side by side (each takes a second or two to shut down): their exit codes.

    Each gets ``sig`` once: a second one could land while Python is finalizing, when the default
    handler is back, and kill a process that was stopping cleanly."""
    for process in processes:
        process.send(sig)
    return [process.wait_exit(timeout) for process in processes]


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


class Ingress:
    """The ingress service's actors with a worker on the runtime's StubBroker."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        assert isinstance(runtime.broker, StubBroker)
        self.broker: StubBroker = runtime.broker
        self.service = build_ingress(runtime)
        self.worker = stub_worker(runtime.broker, {self.service.queue})

    def send_event(self, project_id: uuid.UUID, event: Any) -> None:
        actors.send(
            self.runtime.broker,
            actors.PLATFORM_EVENT,
            actors.PlatformEventMessage(project_id=project_id, event=event),
        )

    def send_raw(self, actor: str, *args: Any) -> None:
        self.runtime.broker.enqueue(
            dramatiq.Message(
                queue_name=actors.INGRESS_QUEUE, actor_name=actor, args=args, kwargs={}, options={}
            )
        )

    def drain(self) -> None:
        """Wait until every message sent so far has been processed (or dead-lettered)."""
        self.broker.join(self.service.queue, fail_fast=False, timeout=30_000)
        self.worker.join()

    @property
    def dead(self) -> list[dramatiq.MessageProxy]:
        return list(self.broker.dead_letters)
