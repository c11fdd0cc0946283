"""`make bench-send-lane`: messages a second through the fake WhatsApp Cloud API, and the claim-to-sent p99.

The fake Graph API (:func:`followups.fake_providers.fake_graph`, a real HTTP server on 127.0.0.1, in a
process of its own as a provider is) answers every send after ``--latency-ms`` (20 ms). ``--projects``
projects (2) have ``--numbers`` numbers each (5),
every number on the fake; ``--messages`` messages (6,000) are queued beforehand, spread over the numbers.
One send lane (:class:`~libs.common.channels.send_lane.SendLane` in its polling loop, as ``followups worker
send-lane`` runs it, with the default ``SEND_LANE_CONCURRENCY`` 64 and ``SEND_LANE_NUMBER_CONCURRENCY`` 8
per number) sends them all.

``sent_per_s`` is the messages SENT over the time from the loop's start to the last SENT; ``p99_ms`` is the
99th percentile of each message's claim (PROCESSING) to SENT (both as recorded in its status events). The
CPU a message costs the send lane's process is printed too (on a loaded machine the rate says more of the
neighbours than of the send lane; the CPU does not). The last line is
``send_lane: sent_per_s=<n> p99_ms=<n>``; target: at least 500 a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from benchmarks.common import bench_database, percentile
from followups.fake_providers import fake_graph
from libs.common.channels.send_lane import SendLane
from libs.common.channels.setup import WhatsAppCloudSetup, set_channel
from libs.common.core.broker import create_broker
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.db import create_pool
from libs.common.core.loops import PollingLoop
from libs.common.core.runtime import Runtime
from libs.common.core.settings import BrokerSettings, DatabaseSettings, Settings
from libs.common.platform import messages
from libs.common.platform.contacts import ContactFields, upsert_contact
from libs.common.platform.numbers import NumberCreate, create_number
from libs.common.platform.projects import create_project
from services.send_lane.service import providers

BENCH_DATABASE = "followups_bench_send_lane"
TOKEN = "bench-access-token"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=6000, help="messages queued beforehand")
    parser.add_argument("--projects", type=int, default=2)
    parser.add_argument("--numbers", type=int, default=5, help="numbers per project")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the fake provider's latency")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("libs").setLevel(logging.ERROR)

    with bench_database(BENCH_DATABASE) as url, _provider(args.latency_ms / 1000) as (graph_url, report):
        base = Settings.from_env({"DATABASE_URL": url})
        settings = dataclasses.replace(
            base, channels=msgspec.structs.replace(base.channels, whatsapp_graph_url=graph_url)
        )
        pool = create_pool(
            DatabaseSettings(url=url, pool_min_size=4, pool_max_size=16), name="bench-send-lane"
        )
        runtime = Runtime(settings, pool, create_broker(BrokerSettings(), embedded=True), SYSTEM_CLOCK)
        queued = _queue(runtime, args.projects, args.numbers, args.messages)
        print(f"queued {queued} messages on {args.projects * args.numbers} numbers", flush=True)

        loops: list[PollingLoop] = []
        client = providers(runtime)
        lane = SendLane(runtime, client, wake=lambda: loops[0].wake())
        loop = PollingLoop("send-lane", lane.tick, poll_interval=0.05, idle_max_sleep=0.05)
        loops.append(loop)
        started, cpu = time.monotonic(), time.process_time()
        loop.start()
        sent = 0
        while sent < queued and time.monotonic() - started < 600:
            time.sleep(0.1)
            with pool.connection() as conn:
                [(sent,)] = conn.execute("SELECT count(*) FROM messages WHERE status = 'SENT'").fetchall()
        with pool.connection() as conn:
            [(last,)] = conn.execute(
                "SELECT extract(epoch FROM max(occurred_at) - min(occurred_at)) FROM message_status_events"
                " WHERE status IN ('PROCESSING', 'SENT')"
            ).fetchall()
            lags = [
                float(ms)
                for (ms,) in conn.execute(
                    "SELECT extract(epoch FROM s.occurred_at - p.occurred_at) * 1000"
                    " FROM message_status_events s JOIN message_status_events p"
                    " ON p.message_id = s.message_id AND p.status = 'PROCESSING' WHERE s.status = 'SENT'"
                )
            ]
        cpu = time.process_time() - cpu
        loop.stop()
        lane.close()
        client.close()
        pool.close()
        elapsed = float(last or 0) or (time.monotonic() - started)
        print(
            f"sent {sent} of {queued} in {elapsed:.2f}s; most in flight at the provider: {report()};"
            f" the send lane's CPU: {cpu * 1000 / max(sent, 1):.2f} ms a message"
        )
        print(f"send_lane: sent_per_s={sent / elapsed:.0f} p99_ms={percentile(lags, 99):.0f}")


@contextmanager
def _provider(latency: float) -> Iterator[tuple[str, Callable[[], int]]]:
    """The fake Graph API in a process of its own (as a provider is: its threads do not share ours), its
    URL, and what tells the most requests it had in flight."""
    context = multiprocessing.get_context("spawn")
    to_child, to_parent = context.Queue(), context.Queue()
    child = context.Process(target=_serve_provider, args=(latency, to_child, to_parent), daemon=True)
    child.start()
    try:

        def report() -> int:
            to_child.put("report")
            most: int = to_parent.get(timeout=10)
            return most

        yield to_parent.get(timeout=60), report
    finally:
        to_child.put("stop")
        child.join(10)


def _serve_provider(latency: float, commands: Any, answers: Any) -> None:
    with fake_graph(access_token=TOKEN) as graph:
        graph.latency = latency
        answers.put(graph.graph_url)
        while (command := commands.get()) != "stop":
            if command == "report":
                answers.put(graph.max_in_flight)


def _queue(runtime: Runtime, projects: int, numbers: int, count: int) -> int:
    """``count`` QUEUED messages over ``projects`` x ``numbers`` numbers on the fake, one contact each."""
    now = runtime.clock.now()
    targets: list[tuple[uuid.UUID, uuid.UUID, uuid.UUID]] = []
    with runtime.pool.connection() as conn:
        for p in range(projects):
            project_id = create_project(conn, f"bench {p}").project_id
            for n in range(numbers):
                number = create_number(conn, project_id, NumberCreate(phone=f"+1555{p:03d}{n:04d}"), now=now)
                setup = WhatsAppCloudSetup(
                    phone_number_id=f"{p + 1}{n:06d}",
                    access_token=TOKEN,
                    app_secret="bench-app-secret",
                    verify_token="bench-verify-token",
                )
                set_channel(conn, project_id, number.id, setup, now=now)
                contact, _ = upsert_contact(conn, project_id, f"+1666{p:03d}{n:04d}", ContactFields())
                targets.append((project_id, number.id, contact.id))
    for start in range(0, count, 500):
        with runtime.pool.connection() as conn:
            for i in range(start, min(count, start + 500)):
                project_id, number_id, contact_id = targets[i % len(targets)]
                message = messages.OutboundMessage(
                    project_id=project_id,
                    contact_id=contact_id,
                    body=f"message {i}",
                    source="api",
                    number_id=number_id,
                )
                messages.queue_contact_message(conn, message, now=now)
    return count


if __name__ == "__main__":
    main()
