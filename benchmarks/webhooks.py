"""`make bench-webhooks`: webhook delivery throughput, and a fast tenant's latency beside a slow one's.

A local receiver (a real HTTP server on 127.0.0.1, opened with ``WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8`` as
an operator would) answers three kinds of endpoints: ``/fast`` (200 at once), ``/sleep`` (200 after 15 s)
and ``/drip`` (a byte every 4 s, never done). Project A's deliveries all go to ``/fast``; project B's, 10 %
of all, go to ``/sleep`` and ``/drip`` in turn. A producer queues R deliveries a second (200 by default)
for S seconds (15 by default), in batches every 50 ms, and nudges the loop as a rule run does; the triggers
service's delivery loop (a :class:`~libs.common.rules.webhooks.Dispatcher` with the default settings:
``WEBHOOK_TIMEOUT_SECONDS`` 10, ``WEBHOOK_CONCURRENCY`` 16, ``WEBHOOK_PROJECT_CONCURRENCY`` 4, in a
polling loop) sends them.

A fast delivery's latency is the wall time the receiver got it minus the time its batch committed.
``deliveries_per_s`` is A's deliveries over the time from the first batch to A's last delivery. The last
line is ``webhooks: deliveries_per_s=<n> fast_tenant_p99_ms=<n>``; target: the fast tenant's p99 under
2,000 ms while B's endpoints sleep and drip.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from benchmarks.common import bench_database, percentile
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.loops import PollingLoop
from libs.common.core.settings import DatabaseSettings, Settings
from libs.common.platform.projects import create_project
from libs.common.rules import egress
from libs.common.rules.webhooks import Dispatcher, queue_delivery

BENCH_DATABASE = "followups_bench_webhooks"
BATCH_EVERY_S = 0.05


class Receiver(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        #: When each fast delivery arrived (monotonic), by delivery id.
        self.arrived: dict[str, float] = {}
        self.slow_requests = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a sender that hit its deadline: expected


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        server = self.server
        if self.path == "/fast":
            with server.lock:
                server.arrived[self.headers["X-Followups-Delivery"]] = time.monotonic()
            self._ok()
            return
        with server.lock:
            server.slow_requests += 1
        if self.path == "/sleep":
            if not server.stopped.wait(15):
                self._ok()
            return
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":  # /drip
            if server.stopped.wait(4):
                return
            self.wfile.write(bytes([byte]))
            self.wfile.flush()

    def _ok(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rate", type=int, default=200, help="deliveries queued a second")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long the producer runs")
    parser.add_argument("--slow-share", type=float, default=0.1, help="share of B's slow deliveries")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("libs.common.rules.webhooks").setLevel(logging.ERROR)  # B's timeouts, by design
    rules = Settings.from_env({}).rules
    egress.configure("127.0.0.0/8")
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{receiver.server_address[1]}"
    with bench_database(BENCH_DATABASE) as url:
        pool = create_pool(
            DatabaseSettings(url=url, pool_min_size=4, pool_max_size=24), name="bench-webhooks"
        )
        with pool.connection() as conn:
            fast_project = create_project(conn, "fast tenant").project_id
            slow_project = create_project(conn, "slow tenant").project_id
        loop: PollingLoop
        dispatcher = Dispatcher(
            pool,
            SYSTEM_CLOCK,
            timeout_s=rules.webhook_timeout_seconds,
            concurrency=rules.webhook_concurrency,
            per_project=rules.webhook_project_concurrency,
            wake=lambda: loop.wake(),
        )
        loop = PollingLoop("webhooks", dispatcher.tick, poll_interval=1.0, idle_max_sleep=5.0)
        loop.start()
        queued: dict[str, float] = {}
        slow_queued = 0
        per_batch = max(1, round(args.rate * BATCH_EVERY_S))
        every = max(1, round(1 / args.slow_share))
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < args.seconds:
            batch: list[uuid.UUID] = []
            with pool.connection() as conn:
                for _ in range(per_batch):
                    n += 1
                    slow = n % every == 0
                    project = slow_project if slow else fast_project
                    path = ("/sleep" if (n // every) % 2 else "/drip") if slow else "/fast"
                    payload = {"event": "bench", "n": n}
                    now = SYSTEM_CLOCK.now()
                    delivery = queue_delivery(
                        conn,
                        project,
                        rule_id=None,
                        trigger_id=None,
                        url=base + path,
                        payload=payload,
                        now=now,
                    )
                    if slow:
                        slow_queued += 1
                    else:
                        batch.append(delivery)
            committed = time.monotonic()
            queued.update((str(d), committed) for d in batch)
            loop.wake()
            time.sleep(max(0.0, BATCH_EVERY_S - (time.monotonic() - committed)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with receiver.lock:
                if len(receiver.arrived) >= len(queued):
                    break
            time.sleep(0.05)
        receiver.stopped.set()
        loop.stop()
        dispatcher.close()
        pool.close()
    receiver.shutdown()
    with receiver.lock:
        arrived = dict(receiver.arrived)
        slow_requests = receiver.slow_requests
    latencies = [(arrived[d] - at) * 1000 for d, at in queued.items() if d in arrived]
    last = max(arrived.values(), default=started)
    per_s = len(latencies) / max(last - started, 1e-9)
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    print(
        f"fast tenant: {len(queued)} queued, {len(latencies)} delivered, p50 {p50:.0f} ms, p99 {p99:.0f} ms,"
        f" max {max(latencies, default=0):.0f} ms"
    )
    print(f"slow tenant: {slow_queued} queued (sleeping or dripping), {slow_requests} attempted")
    print(f"webhooks: deliveries_per_s={per_s:.0f} fast_tenant_p99_ms={p99:.0f}")


if __name__ == "__main__":
    main()
