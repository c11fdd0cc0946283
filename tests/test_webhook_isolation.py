"""Webhooks go only where they may (no SSRF), each attempt within one deadline, fair across projects, and a
poison answer is recorded with the attempt limit holding; a replay under another delivery id fails.

Receivers are real local servers: an HTTP one (tests/test_webhooks.py's) and raw TCP ones that answer what
no HTTP server would (a byte every so often, NUL and binary status lines)."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.core.settings import Settings, SettingsError
from libs.common.rules import egress
from libs.common.rules.webhooks import MAX_ATTEMPTS, Dispatcher, deliver, verify_signature
from services.triggers.service import WEBHOOKS_LOOP
from services.triggers.service import build as build_triggers
from tests.conftest import Project
from tests.delayed_rule_helpers import assert_problem
from tests.helpers import rows, wait_until
from tests.test_webhooks import Receiver, _delivery, _queue, _serving

#: Every spelling of an address a webhook may not reach by default.
BLOCKED = [
    "http://127.0.0.1/hook",
    "http://127.0.0.2:8080/hook",
    "http://2130706433/hook",
    "http://0x7f000001/hook",
    "http://127.1/hook",
    "http://0177.0.0.1/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::127.0.0.1]/hook",
    "http://0.0.0.0/hook",
    "http://0/hook",
    "http://[::]/hook",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://172.31.255.255/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://[fe80::1]/hook",
    "http://[fc00::1]/hook",
    "http://[fd12:3456::1]/hook",
    "http://224.0.0.1/hook",
    "http://[ff02::1]/hook",
    "http://[::ffff:10.0.0.1]/hook",
    "http://[::ffff:169.254.169.254]/hook",
    "http://[64:ff9b::a00:1]/hook",
    "https://[2002:c0a8:101::]/hook",
    "http://255.255.255.255/hook",
]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with _serving() as receiver:
        yield receiver


@pytest.fixture
def default_networks() -> None:
    """WEBHOOK_ALLOWED_NETWORKS as it ships: empty (the suite's fixture opens loopback; this closes it)."""
    egress.configure(Settings.from_env({}).rules.webhook_allowed_networks)


@pytest.mark.parametrize("url", BLOCKED)
def test_a_literal_internal_address_is_refused_when_the_rule_is_saved(
    client: TestClient[Any], default_networks: None, url: str
) -> None:
    body = {"name": "hook", "event": "contact.created", "actions": [{"type": "send_webhook", "url": url}]}
    problem = assert_problem(client.post("/v1/rules", json=body), 422, "actions.0.url")
    assert "WEBHOOK_ALLOWED_NETWORKS" in problem["errors"][0]["message"]
    assert client.get("/v1/rules").json()["items"] == []


def test_a_public_address_or_a_name_is_accepted_when_saved(
    client: TestClient[Any], default_networks: None
) -> None:
    for url in ("https://hooks.example.com/x", "http://93.184.216.34/hook", "http://[2606:4700::1]/hook"):
        body = {"name": "hook", "event": "contact.created", "actions": [{"type": "send_webhook", "url": url}]}
        assert client.post("/v1/rules", json=body).status_code == 201, url


def test_allowed_networks_open_a_range_and_a_bad_one_is_a_settings_error(client: TestClient[Any]) -> None:
    egress.configure(
        Settings.from_env({"WEBHOOK_ALLOWED_NETWORKS": "10.0.0.0/8"}).rules.webhook_allowed_networks
    )
    body: dict[str, Any] = {"name": "hook", "event": "contact.created"}
    body["actions"] = [{"type": "send_webhook", "url": "http://10.1.2.3/hook"}]
    assert client.post("/v1/rules", json=body).status_code == 201
    body["actions"] = [{"type": "send_webhook", "url": "http://192.168.1.1/hook"}]
    assert_problem(client.post("/v1/rules", json=body), 422, "actions.0.url")
    with pytest.raises(SettingsError, match="WEBHOOK_ALLOWED_NETWORKS"):
        Settings.from_env({"WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8,not-a-network"})


def _resolving(name: str, *addresses: str) -> egress.Resolver:
    """A resolver that knows one name (a DNS answer the test controls)."""

    def resolve(host: str, port: int) -> Sequence[str]:
        if host != name:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return list(addresses)

    return resolve


def test_a_name_resolving_to_loopback_fails_as_blocked_address_without_a_connection(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver, default_networks: None
) -> None:
    port = receiver.url.split(":")[2].split("/")[0]
    for url, resolve in (
        (f"http://localhost:{port}/hook", egress.system_resolver),
        (f"http://hooks.example.test:{port}/hook", _resolving("hooks.example.test", "127.0.0.1")),
        (f"http://mixed.example.test:{port}/hook", _resolving("mixed.example.test", "10.0.0.1", "::1")),
    ):
        delivery_id = _queue(pool, clock, project.id, url)
        state = deliver(pool, project.id, delivery_id, now=clock.now(), resolve=resolve)
        assert state is not None, url
        assert (state.status, state.attempts, state.last_status_code) == ("pending", 1, None)
        assert state.last_error == "blocked_address"
    assert receiver.requests == []


def test_an_opened_network_lets_a_name_through_to_the_checked_address_with_its_own_host_header(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    egress.configure("127.0.0.0/8")
    port = receiver.url.split(":")[2].split("/")[0]
    url = f"http://hooks.example.test:{port}/hook?x=1"
    delivery_id = _queue(pool, clock, project.id, url)

    state = deliver(
        pool, project.id, delivery_id, now=clock.now(), resolve=_resolving("hooks.example.test", "127.0.0.1")
    )

    assert state is not None and (state.status, state.last_status_code) == ("delivered", 200)
    [request] = receiver.requests
    assert request.path == "/hook?x=1"
    assert request.headers["Host"] == f"hooks.example.test:{port}"


def test_an_unknown_name_is_a_dns_error(pool: ConnectionPool, clock: ManualClock, project: Project) -> None:
    unknown = _queue(pool, clock, project.id, "http://nowhere.example.test/hook")
    state = deliver(
        pool, project.id, unknown, now=clock.now(), resolve=_resolving("elsewhere.test", "127.0.0.1")
    )
    assert state is not None and state.last_error == "dns_error"


@contextmanager
def _raw_server(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A TCP server on loopback that reads a request's head, then lets ``answer`` write what it likes; its
    URL. ``answer`` gets an event set when the server stops (a dripping answer stops with it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stopped = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            head = b""
            try:
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                answer(conn, stopped)
            except OSError:
                pass  # the client gave up (its deadline): expected

    def serve() -> None:
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    finally:
        stopped.set()
        thread.join(5)
        listener.close()


def _attempted(pool: ConnectionPool, project_id: uuid.UUID, delivery_id: uuid.UUID) -> tuple[int, str | None]:
    """A delivery's attempts so far and its last error."""
    delivery = _delivery(pool, project_id, delivery_id)
    return delivery.attempts, delivery.last_error


def _dripping(conn: socket.socket, stopped: threading.Event) -> None:
    """A byte every 0.3 s, forever: no single read waits long, the whole answer never ends."""
    for byte in b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 10_000:
        if stopped.wait(0.3):
            return
        conn.sendall(bytes([byte]))


def test_a_sleeping_and_a_dripping_endpoint_are_cut_at_the_deadline_while_another_project_goes_through(
    pool: ConnectionPool, clock: ManualClock, project: Project, other_project: Project
) -> None:
    with _serving() as sleeping, _raw_server(_dripping) as dripping, _serving() as fast:
        sleeping.default = "sleep"
        sleeping.sleep_s = 60
        # Given project B's four deliveries to endpoints that hold a connection for long, queued first
        slow = []
        for url in (sleeping.url, dripping) * 2:
            slow.append(_queue(pool, clock, other_project.id, url))
            clock.advance(timedelta(milliseconds=1))
        mine = _queue(pool, clock, project.id, fast.url)
        woken = threading.Semaphore(0)
        dispatcher = Dispatcher(pool, clock, timeout_s=2.5, concurrency=4, per_project=2, wake=woken.release)
        try:
            # When the dispatcher ticks: B gets its two slots, A its own beside them
            assert dispatcher.tick() == 3
            # Then A's delivery is delivered while B's endpoints still hold their connections (leased)
            wait_until(lambda: _delivery(pool, project.id, mine).status == "delivered", what="A delivered")
            # (each attempt leases its delivery in its own thread, which may start after A's was answered)
            wait_until(
                lambda: [_attempted(pool, other_project.id, d) for d in slow[:2]] == [(1, None), (1, None)],
                what="B's first two deliveries leased, their attempts under way",
            )
            # and B's two attempts end at the deadline although the dripping one never stopped sending
            for _ in range(3):
                woken.acquire(timeout=10)
            states = {d: _delivery(pool, other_project.id, d) for d in slow}
            attempted = [s for s in states.values() if s.attempts == 1]
            assert len(attempted) == 2
            assert {(s.status, s.last_error, s.last_status_code) for s in attempted} == {
                ("pending", "timeout", None)
            }
            assert [s.id for s in attempted] == slow[:2]
            # and B's other two go out on the next tick (their turn, not starved)
            assert dispatcher.tick() == 2
        finally:
            sleeping.released.set()
            dispatcher.close()


POISON = [
    pytest.param(b"HTTP/1.1 2\x0000 OK\r\n\r\n", id="nul-in-the-status"),
    pytest.param(b"HTTP/1.1 200 OK\x00\xff\r\nX: y\r\n\r\n", id="nul-and-binary-in-the-reason"),
    pytest.param(b"\x00\xff\xfe\x80binary\r\n\r\n", id="binary"),
    pytest.param(b"HTTP/1.1 200 " + b"A" * 100_000 + b"\r\n\r\n", id="huge-status-line"),
    pytest.param(b"HTTP/1.1 99999 OK\r\n\r\n", id="status-out-of-range"),
    pytest.param(b"", id="closed-without-answer"),
]


@pytest.mark.parametrize("answer", POISON)
def test_whatever_the_peer_sends_the_attempt_is_recorded_and_the_attempt_limit_holds(
    pool: ConnectionPool, clock: ManualClock, project: Project, answer: bytes
) -> None:
    def poison(conn: socket.socket, stopped: threading.Event) -> None:
        conn.sendall(answer)

    with _raw_server(poison) as url:
        delivery_id = _queue(pool, clock, project.id, url)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            state = deliver(pool, project.id, delivery_id, now=clock.now())
            assert state is not None
            assert (state.attempts, state.last_error, state.last_status_code) == (
                attempt,
                "bad_response",
                None,
            )
            assert state.status == ("failed" if attempt == MAX_ATTEMPTS else "pending")
            clock.advance(timedelta(hours=1))
        assert deliver(pool, project.id, delivery_id, now=clock.now()) is None
    assert _delivery(pool, project.id, delivery_id).attempts == MAX_ATTEMPTS


def test_a_delivery_whose_last_attempt_was_never_recorded_is_given_up_not_claimed_again(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    # a worker that died during the eighth attempt leaves the delivery pending, its lease running out
    delivery_id = _queue(pool, clock, project.id, receiver.url)
    rows(
        pool,
        "UPDATE webhook_deliveries SET attempts = %s, next_attempt_at = %s WHERE id = %s RETURNING id",
        MAX_ATTEMPTS,
        clock.now(),
        delivery_id,
    )
    assert deliver(pool, project.id, delivery_id, now=clock.now()) is None
    dispatcher = Dispatcher(pool, clock, timeout_s=1, concurrency=2, per_project=1)
    try:
        assert dispatcher.tick() == 0
    finally:
        dispatcher.close()
    delivery = _delivery(pool, project.id, delivery_id)
    assert (delivery.status, delivery.attempts, delivery.last_error) == (
        "failed",
        MAX_ATTEMPTS,
        "attempts_exhausted",
    )
    assert receiver.requests == []


def test_a_replay_under_a_new_delivery_id_fails_verification(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    [(secret,)] = rows(pool, "SELECT webhook_secret FROM projects WHERE id = %s", project.id)
    receiver.holds = secret
    delivery_id = _queue(pool, clock, project.id, receiver.url)
    state = deliver(pool, project.id, delivery_id, now=clock.now())
    assert state is not None and state.status == "delivered"
    [request] = receiver.requests
    stamp, signature = request.headers["X-Followups-Timestamp"], request.headers["X-Followups-Signature"]
    assert verify_signature(secret, stamp, request.body, signature, delivery_id=delivery_id)
    # the same body, timestamp and signature under another delivery id (to slip past deduplication)
    assert not verify_signature(secret, stamp, request.body, signature, delivery_id=uuid.uuid4())


def test_tls_to_a_plain_server_is_a_tls_error_and_a_non_ascii_path_is_percent_encoded(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    tls = _queue(pool, clock, project.id, receiver.url.replace("http://", "https://"))
    state = deliver(pool, project.id, tls, now=clock.now())
    assert state is not None and (state.last_error, state.last_status_code) == ("tls_error", None)

    unicode = _queue(pool, clock, project.id, receiver.url + "/olá?q=ü")
    state = deliver(pool, project.id, unicode, now=clock.now())
    assert state is not None and state.status == "delivered"
    assert receiver.requests[-1].path == "/hook/ol%C3%A1?q=%C3%BC"


def test_a_lookup_that_hangs_is_cut_at_the_attempts_deadline(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    answered = threading.Event()

    def hanging(host: str, port: int) -> Sequence[str]:
        answered.wait(30)
        return ["127.0.0.1"]

    delivery_id = _queue(pool, clock, project.id, "http://slow-dns.example.test/hook")
    try:
        state = deliver(pool, project.id, delivery_id, now=clock.now(), timeout_s=0.3, resolve=hanging)
    finally:
        answered.set()
    assert state is not None and (state.status, state.last_error) == ("pending", "timeout")


def test_the_triggers_service_delivers_in_parallel_within_its_settings_bounds(
    runtime: Runtime, clock: ManualClock, project: Project, other_project: Project
) -> None:
    rules = msgspec.structs.replace(
        runtime.settings.rules,
        webhook_timeout_seconds=2.5,
        webhook_concurrency=2,
        webhook_project_concurrency=1,
    )
    runtime.settings = replace(runtime.settings, rules=rules)
    pool = runtime.pool
    with _serving() as sleeping, _serving() as fast:
        sleeping.default = "sleep"
        sleeping.sleep_s = 60
        slow = [_queue(pool, clock, other_project.id, sleeping.url) for _ in range(2)]
        loop = build_triggers(runtime).loop(WEBHOOKS_LOOP)
        loop.start()
        try:
            wait_until(lambda: len(sleeping.requests) == 1, what="B's first attempt under way")
            mine = _queue(pool, clock, project.id, fast.url)
            loop.wake()
            # A's delivery goes out in the slot B may not take (one of B's at a time)
            wait_until(lambda: _delivery(pool, project.id, mine).status == "delivered", what="A delivered")
            assert len(sleeping.requests) == 1
            assert sorted(_delivery(pool, other_project.id, d).attempts for d in slow) == [0, 1]
        finally:
            sleeping.released.set()
            loop.stop()
