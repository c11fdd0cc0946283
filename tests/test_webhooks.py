"""Webhook deliveries against a real local HTTP server: signing, retries with backoff, giving up, no double
send under concurrent workers, and the project-scoped reads."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.rules import webhooks
from libs.common.rules.webhooks import (
    MAX_ATTEMPTS,
    backoff,
    deliver,
    deliver_due,
    get_delivery,
    list_deliveries,
    queue_delivery,
    verify_signature,
)
from tests.conftest import Project
from tests.helpers import rows, wait_until


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """What the test server received, and how it answers: each request takes the next planned answer (a
    status code, or "sleep": answer 200 only after ``sleep_s``), then ``default`` once the plan runs out."""

    url: str
    requests: list[Received] = field(default_factory=list)
    plan: list[int | str] = field(default_factory=list)
    default: int | str = 200
    sleep_s: float = 1.0
    #: The webhook secret the receiver holds: set, it answers 401 to a request whose signature it cannot
    #: verify with it (as a receiver should).
    holds: str | None = None
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_answer(self, received: Received) -> int | str:
        with self.lock:
            self.requests.append(received)
            return self.plan.pop(0) if self.plan else self.default


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            answer = receiver.next_answer(Received(self.path, dict(self.headers.items()), body))
            signature = self.headers.get("X-Followups-Signature", "")
            timestamp = self.headers.get("X-Followups-Timestamp", "")
            delivery_id = self.headers.get("X-Followups-Delivery", "")
            if receiver.holds is not None and not verify_signature(
                receiver.holds, timestamp, body, signature, delivery_id=delivery_id
            ):
                answer = 401
            if answer == "sleep":
                receiver.released.wait(receiver.sleep_s)
                answer = 200
            assert isinstance(answer, int)
            self.send_response(answer)
            if 300 <= answer < 400:
                self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (a timeout test) leaves a broken pipe: expected


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with _serving() as receiver:
        yield receiver


@contextmanager
def _serving() -> Iterator[Receiver]:
    """A local HTTP server receiving webhooks, for as long as the block runs."""
    server = _Server(("127.0.0.1", 0), BaseHTTPRequestHandler)
    receiver = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hook")
    server.RequestHandlerClass = _handler(receiver)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.released.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


#: The public id of the trigger a test delivery came of.
TRIGGER = uuid.UUID("0e5c4d7a-39f1-4c65-9a43-5a1c8b6f2d10")


def _rule(pool: ConnectionPool, project_id: uuid.UUID) -> uuid.UUID:
    actions = json.dumps([{"type": "send_webhook", "url": "http://example.invalid/hook"}])
    [(rule_id,)] = rows(
        pool,
        "INSERT INTO rules (project_id, name, event, actions) VALUES (%s, 'hook', 'message.received', %s)"
        " RETURNING id",
        project_id,
        actions,
    )
    assert isinstance(rule_id, uuid.UUID)
    return rule_id


def _queue(
    pool: ConnectionPool,
    clock: ManualClock,
    project_id: uuid.UUID,
    url: str,
    payload: dict[str, Any] | None = None,
    rule_id: uuid.UUID | None = None,
) -> uuid.UUID:
    with pool.connection() as conn:
        return queue_delivery(
            conn,
            project_id,
            rule_id=rule_id,
            trigger_id=TRIGGER,
            url=url,
            payload=payload if payload is not None else {"event": "message.received"},
            now=clock.now(),
        )


def _delivery(pool: ConnectionPool, project_id: uuid.UUID, delivery_id: uuid.UUID) -> webhooks.Delivery:
    with pool.connection() as conn:
        return get_delivery(conn, project_id, delivery_id)


def test_a_delivery_arrives_signed_with_the_projects_secret(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    rule_id = _rule(pool, project.id)
    payload = {"event": "message.received", "text": "olá", "n": 3, "nested": {"a": [1, 2]}}
    delivery_id = _queue(pool, clock, project.id, receiver.url, payload, rule_id=rule_id)

    state = deliver(pool, project.id, delivery_id, now=clock.now())

    assert state is not None
    assert (state.status, state.attempts, state.last_status_code) == ("delivered", 1, 200)
    assert state.delivered_at == clock.now() and state.next_attempt_at is None
    [request] = receiver.requests
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert request.path == "/hook"
    assert json.loads(request.body) == payload
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == "followups-webhooks"
    assert headers["x-followups-delivery"] == str(delivery_id)
    timestamp = headers["x-followups-timestamp"]
    assert int(timestamp) == int(clock.now().timestamp())
    [(secret,)] = rows(pool, "SELECT webhook_secret FROM projects WHERE id = %s", project.id)
    signed = f"{timestamp}.{delivery_id}.".encode() + request.body
    by_hand = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    assert headers["x-followups-signature"] == f"sha256={by_hand}"
    signature = headers["x-followups-signature"]
    assert verify_signature(secret, timestamp, request.body, signature, delivery_id=delivery_id)
    assert verify_signature(
        secret, int(timestamp), request.body.decode(), signature, delivery_id=str(delivery_id)
    )
    # a changed body, timestamp, delivery id or secret, or a malformed signature, does not verify
    assert not verify_signature(secret, timestamp, request.body + b" ", signature, delivery_id=delivery_id)
    assert not verify_signature(secret, int(timestamp) + 1, request.body, signature, delivery_id=delivery_id)
    assert not verify_signature(secret, timestamp, request.body, signature, delivery_id=uuid.uuid4())
    assert not verify_signature(secret + "x", timestamp, request.body, signature, delivery_id=delivery_id)
    assert not verify_signature(secret, timestamp, request.body, by_hand[1:], delivery_id=delivery_id)
    assert not verify_signature(secret, timestamp, request.body, "sha256=ünïcode", delivery_id=delivery_id)

    delivery = _delivery(pool, project.id, delivery_id)
    assert (delivery.rule_id, delivery.trigger_id, delivery.url) == (rule_id, TRIGGER, receiver.url)
    assert delivery.payload == payload
    # delivered: not attempted again
    assert deliver(pool, project.id, delivery_id, now=clock.advance(timedelta(hours=1))) is None
    assert deliver_due(pool, clock) == 0
    assert len(receiver.requests) == 1


def test_a_500_is_retried_after_the_backoff_then_delivered(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    receiver.plan = [500]
    delivery_id = _queue(pool, clock, project.id, receiver.url)
    first = clock.now()

    state = deliver(pool, project.id, delivery_id, now=first)

    assert state is not None
    assert (state.status, state.attempts, state.last_status_code) == ("pending", 1, 500)
    assert state.last_error == "http_500"
    assert state.next_attempt_at == first + timedelta(seconds=30)
    # not due before the backoff has passed
    assert deliver(pool, project.id, delivery_id, now=clock.advance(timedelta(seconds=29))) is None
    assert deliver_due(pool, clock) == 0
    assert len(receiver.requests) == 1

    clock.advance(timedelta(seconds=1))
    assert deliver_due(pool, clock) == 1

    delivery = _delivery(pool, project.id, delivery_id)
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 2, 200)
    assert delivery.delivered_at == first + timedelta(seconds=30)
    assert delivery.last_error is None and delivery.next_attempt_at is None
    assert len(receiver.requests) == 2
    # each attempt is signed afresh, with its own timestamp
    stamps = [r.headers["X-Followups-Timestamp"] for r in receiver.requests]
    assert int(stamps[1]) - int(stamps[0]) == 30


def test_backoff_doubles_from_30_seconds_up_to_an_hour() -> None:
    assert [backoff(n).total_seconds() for n in range(1, 10)] == [
        30,
        60,
        120,
        240,
        480,
        960,
        1920,
        3600,
        3600,
    ]
    assert backoff(1000) == timedelta(hours=1)


def test_a_refused_connection_is_retried_not_raised(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    delivery_id = _queue(pool, clock, project.id, f"http://127.0.0.1:{_closed_port()}/hook")

    state = deliver(pool, project.id, delivery_id, now=clock.now())

    assert state is not None
    assert (state.status, state.attempts, state.last_status_code) == ("pending", 1, None)
    assert state.last_error == "connect_refused"
    assert state.next_attempt_at == clock.now() + timedelta(seconds=30)


def test_a_timeout_is_retried_not_raised(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    receiver.plan = ["sleep"]
    delivery_id = _queue(pool, clock, project.id, receiver.url)

    state = deliver(pool, project.id, delivery_id, now=clock.now(), timeout_s=0.2)
    receiver.released.set()

    assert state is not None
    assert (state.status, state.attempts, state.last_status_code) == ("pending", 1, None)
    assert state.last_error == "timeout"
    assert state.next_attempt_at == clock.now() + timedelta(seconds=30)


def test_a_redirect_is_not_followed(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    receiver.plan = [302]
    delivery_id = _queue(pool, clock, project.id, receiver.url)

    state = deliver(pool, project.id, delivery_id, now=clock.now())

    assert state is not None
    assert (state.status, state.attempts, state.last_status_code) == ("pending", 1, 302)
    assert [r.path for r in receiver.requests] == ["/hook"]


def test_after_max_attempts_it_is_failed_and_no_longer_picked(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    receiver.default = 503
    delivery_id = _queue(pool, clock, project.id, receiver.url)

    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert deliver_due(pool, clock) == 1
        delivery = _delivery(pool, project.id, delivery_id)
        assert delivery.attempts == attempt
        if attempt < MAX_ATTEMPTS:
            assert delivery.status == "pending"
            assert delivery.next_attempt_at == clock.now() + backoff(attempt)
            clock.advance(backoff(attempt))

    assert (delivery.status, delivery.last_status_code, delivery.next_attempt_at) == ("failed", 503, None)
    assert delivery.delivered_at is None
    clock.advance(timedelta(days=1))
    assert deliver_due(pool, clock) == 0
    assert deliver(pool, project.id, delivery_id, now=clock.now()) is None
    assert len(receiver.requests) == MAX_ATTEMPTS


def test_two_concurrent_deliveries_post_once(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    receiver.plan = ["sleep"]
    receiver.sleep_s = 0.3  # the first call is still running when the second claims
    delivery_id = _queue(pool, clock, project.id, receiver.url)
    start = threading.Barrier(2)
    results: list[webhooks.DeliveryState | None] = []

    def attempt() -> None:
        start.wait()
        results.append(deliver(pool, project.id, delivery_id, now=clock.now()))

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert len(receiver.requests) == 1
    assert len(results) == 2 and results.count(None) == 1
    assert _delivery(pool, project.id, delivery_id).status == "delivered"


def test_a_late_result_after_the_lease_ran_out_is_not_recorded(
    pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    # a worker whose call outlived its lease: another worker claims the delivery again and delivers it; the
    # first one's late result does not overwrite that
    receiver.plan = ["sleep"]
    receiver.sleep_s = 5
    delivery_id = _queue(pool, clock, project.id, receiver.url)
    first = clock.now()
    late: list[webhooks.DeliveryState | None] = []
    slow = threading.Thread(
        target=lambda: late.append(deliver(pool, project.id, delivery_id, now=first, timeout_s=10))
    )
    slow.start()
    try:
        _wait_for_requests(receiver, 1)
        assert (
            deliver(pool, project.id, delivery_id, now=first + timedelta(seconds=39)) is None
        )  # still leased
        state = deliver(pool, project.id, delivery_id, now=first + timedelta(seconds=40))
        assert state is not None
        assert (state.status, state.attempts) == ("delivered", 2)
    finally:
        receiver.released.set()
        slow.join(10)
    [after] = late
    assert after is not None
    assert (after.status, after.attempts, after.last_status_code) == ("delivered", 2, 200)


def _wait_for_requests(receiver: Receiver, count: int) -> None:
    wait_until(lambda: len(receiver.requests) >= count, timeout=5, what=f"{count} requests")


def test_list_and_get_page_by_id_within_the_project(
    pool: ConnectionPool, clock: ManualClock, project: Project, other_project: Project, receiver: Receiver
) -> None:
    rule_id = _rule(pool, project.id)
    ruled = {_queue(pool, clock, project.id, receiver.url, rule_id=rule_id) for _ in range(3)}
    unruled = {_queue(pool, clock, project.id, receiver.url) for _ in range(2)}
    theirs = _queue(pool, clock, other_project.id, receiver.url)
    delivered = sorted(ruled)[0]
    assert deliver(pool, project.id, delivered, now=clock.now()) is not None

    with pool.connection() as conn:
        pages, after = [], None
        while page := list_deliveries(conn, project.id, limit=2, after=after):
            pages.append([d.id for d in page])
            after = page[-1].id
        assert [len(p) for p in pages] == [2, 2, 1]
        assert [i for p in pages for i in p] == sorted(ruled | unruled)

        of_rule = list_deliveries(conn, project.id, rule_id=rule_id, limit=10)
        assert [d.id for d in of_rule] == sorted(ruled)
        assert [d.id for d in list_deliveries(conn, project.id, status="delivered", limit=10)] == [delivered]
        pending_of_rule = list_deliveries(conn, project.id, rule_id=rule_id, status="pending", limit=10)
        assert {d.id for d in pending_of_rule} == ruled - {delivered}
        with pytest.raises(InvalidInput) as invalid:
            list_deliveries(conn, project.id, status="sent", limit=10)
        assert invalid.value.field == "status"

        assert get_delivery(conn, project.id, delivered).status == "delivered"
        # another project's delivery is not visible
        assert theirs not in {d.id for d in list_deliveries(conn, project.id, limit=100)}
        with pytest.raises(NotFound) as not_found:
            get_delivery(conn, project.id, theirs)
        assert not_found.value.field == "delivery_id"
        with pytest.raises(NotFound):
            get_delivery(conn, project.id, uuid.uuid4())
        assert [d.id for d in list_deliveries(conn, other_project.id, limit=10)] == [theirs]


def test_only_http_and_https_urls_are_queued(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    for url in ("file:///etc/passwd", "ftp://example.com/x", "/relative", "http://"):
        with pytest.raises(InvalidInput) as invalid:
            _queue(pool, clock, project.id, url)
        assert invalid.value.field == "url"


# --- rotating the signing secret


def _secret(client: TestClient[Any]) -> dict[str, Any]:
    response = client.get("/v1/webhook-deliveries/secret")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _rotate(client: TestClient[Any], body: dict[str, Any] | None = None) -> dict[str, Any]:
    response = client.post("/v1/webhook-deliveries/secret/rotate", json=body)
    assert response.status_code == 200, response.text
    rotated: dict[str, Any] = response.json()
    return rotated


def _rotations(kind: str) -> float:
    value = REGISTRY.get_sample_value("followups_webhook_secret_rotations_total", {"kind": kind})
    return value or 0.0


def _id(received: Received) -> str:
    return received.headers["X-Followups-Delivery"]


def _signatures(received: Received) -> list[str]:
    return [s.strip() for s in received.headers["X-Followups-Signature"].split(",")]


def test_a_rotated_secret_signs_beside_the_new_one_during_the_overlap_then_only_the_new_one(
    client: TestClient[Any],
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    other_project: Project,
) -> None:
    # Given two receivers of the project's webhooks: one holds the secret of today, one will hold the next
    old = _secret(client)
    assert old["previous_valid_until"] is None
    [(theirs_before,)] = rows(pool, "SELECT webhook_secret FROM projects WHERE id = %s", other_project.id)
    with _serving() as keeps_old, _serving() as takes_new:
        keeps_old.holds = old["secret"]
        assert (
            deliver(pool, project.id, _queue(pool, clock, project.id, keeps_old.url), now=clock.now())
            is not None
        )
        [before] = keeps_old.requests
        assert _signatures(before) == [
            webhooks.sign(
                old["secret"], before.headers["X-Followups-Timestamp"], before.body, delivery_id=_id(before)
            )
        ]

        # When the secret is rotated (the default overlap: WEBHOOK_SECRET_OVERLAP_SECONDS, a day)
        counted = _rotations("overlap")
        rotated = _rotate(client)
        assert _rotations("overlap") == counted + 1
        assert rotated["secret"] != old["secret"] and len(rotated["secret"]) == 64
        until = datetime.fromisoformat(rotated["previous_valid_until"])
        assert until == clock.now() + timedelta(days=1)
        assert _secret(client) == rotated
        takes_new.holds = rotated["secret"]

        # Then during the overlap each delivery carries both signatures, the new one first: each receiver
        # verifies it with the secret it holds
        clock.advance(timedelta(hours=23, minutes=59))
        for receiver in (keeps_old, takes_new):
            state = deliver(pool, project.id, _queue(pool, clock, project.id, receiver.url), now=clock.now())
            assert state is not None and (state.status, state.last_status_code) == ("delivered", 200)
        during = takes_new.requests[-1]
        stamp = during.headers["X-Followups-Timestamp"]
        by_new, by_old = (
            webhooks.sign(k, stamp, during.body, delivery_id=_id(during))
            for k in (rotated["secret"], old["secret"])
        )
        assert during.headers["X-Followups-Signature"] == f"{by_new}, {by_old}"
        for secret in (rotated["secret"], old["secret"]):
            assert verify_signature(
                secret, stamp, during.body, during.headers["X-Followups-Signature"], delivery_id=_id(during)
            )
        assert not verify_signature(
            "another secret",
            stamp,
            during.body,
            during.headers["X-Followups-Signature"],
            delivery_id=_id(during),
        )

        # And once the overlap ended only the new secret signs: the receiver still on the old one refuses it
        clock.advance(timedelta(minutes=1))
        assert _secret(client) == {"secret": rotated["secret"], "previous_valid_until": None}
        refused = deliver(pool, project.id, _queue(pool, clock, project.id, keeps_old.url), now=clock.now())
        assert refused is not None and (refused.status, refused.last_status_code) == ("pending", 401)
        after = keeps_old.requests[-1]
        assert _signatures(after) == [
            webhooks.sign(
                rotated["secret"], after.headers["X-Followups-Timestamp"], after.body, delivery_id=_id(after)
            )
        ]
        state = deliver(pool, project.id, _queue(pool, clock, project.id, takes_new.url), now=clock.now())
        assert state is not None and state.status == "delivered"
    # and the other project's secret did not change
    assert rows(pool, "SELECT webhook_secret FROM projects WHERE id = %s", other_project.id) == [
        (theirs_before,)
    ]


def test_a_rotation_without_overlap_ends_the_old_secret_at_once_and_two_are_valid_at_most(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock, project: Project, receiver: Receiver
) -> None:
    first = _secret(client)["secret"]
    # a leaked secret: rotated with no overlap, it signs nothing more
    counted = _rotations("immediate")
    second = _rotate(client, {"overlap_seconds": 0})
    assert _rotations("immediate") == counted + 1
    assert second["previous_valid_until"] is None
    assert (
        deliver(pool, project.id, _queue(pool, clock, project.id, receiver.url), now=clock.now()) is not None
    )
    assert _signatures(receiver.requests[-1]) == [
        webhooks.sign(
            second["secret"],
            receiver.requests[-1].headers["X-Followups-Timestamp"],
            receiver.requests[-1].body,
            delivery_id=_id(receiver.requests[-1]),
        )
    ]
    # a rotation with an hour's overlap, then another one during it: the oldest secret is dropped at once
    third = _rotate(client, {"overlap_seconds": 3600})
    assert datetime.fromisoformat(third["previous_valid_until"]) == clock.now() + timedelta(hours=1)
    fourth = _rotate(client, {"overlap_seconds": 600})
    assert (
        deliver(pool, project.id, _queue(pool, clock, project.id, receiver.url), now=clock.now()) is not None
    )
    last = receiver.requests[-1]
    stamp = last.headers["X-Followups-Timestamp"]
    assert _signatures(last) == [
        webhooks.sign(s, stamp, last.body, delivery_id=_id(last)) for s in (fourth["secret"], third["secret"])
    ]
    assert len({first, second["secret"], third["secret"], fourth["secret"]}) == 4


@pytest.mark.parametrize("overlap", [-1, 604801, "3600", 1.5])
def test_a_bad_overlap_is_refused_naming_the_field_and_changes_nothing(
    client: TestClient[Any], overlap: Any
) -> None:
    before = _secret(client)
    response = client.post("/v1/webhook-deliveries/secret/rotate", json={"overlap_seconds": overlap})
    assert response.status_code == (400 if isinstance(overlap, str | float) else 422), response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "overlap_seconds" in {error["field"] for error in response.json()["errors"]}
    assert _secret(client) == before
    unknown = client.post("/v1/webhook-deliveries/secret/rotate", json={"overlap": 60})
    assert unknown.status_code == 400 and _secret(client) == before
