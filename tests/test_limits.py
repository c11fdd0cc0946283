"""The API's limits: throttling (failed sign-ins and bearer keys per address, requests per key) answered
429 with ``Retry-After``; the header and body deadlines over real sockets; no 500 on any header value;
``/metrics`` behind ``METRICS_TOKEN`` or on ``API_METRICS_PORT``.

The 429 logic runs through the TestClient on the test's ``ManualClock`` ("a minute later" is a call); what
depends on sockets (deadlines, ``X-Forwarded-For``, raw header bytes) runs through uvicorn on a free port,
configured as the CLI configures it (:func:`services.api.server.config`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import timedelta
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
from litestar import Litestar
from litestar.testing import TestClient
from prometheus_client import REGISTRY

from followups.runner import serve_metrics
from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from services.api import server
from services.api.app import create_app
from services.api.limits import Limits, Rate
from services.api.problems import PROBLEM_JSON
from tests.conftest import Project, client_of
from tests.helpers import wait_until

# --- helpers -----------------------------------------------------------------------------------------------


def with_api(runtime: Runtime, **api: Any) -> Runtime:
    """``runtime`` with some of its API settings changed (same pool, broker and clock)."""
    settings = dataclasses.replace(runtime.settings, api=msgspec.structs.replace(runtime.settings.api, **api))
    return dataclasses.replace(runtime, settings=settings)


@contextmanager
def limited_client(app: Litestar, runtime: Runtime, **api: Any) -> Iterator[TestClient[Any]]:
    with client_of(app, with_api(runtime, **api)) as client:
        yield client


def throttled(limit: str) -> float:
    return REGISTRY.get_sample_value("followups_api_throttled_total", {"limit": limit}) or 0.0


def assert_429(response: httpx.Response, retry_after: int | None = None) -> dict[str, Any]:
    assert response.status_code == 429, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    assert int(response.headers["retry-after"]) >= 1
    if retry_after is not None:
        assert response.headers["retry-after"] == str(retry_after)
    body: dict[str, Any] = response.json()
    assert body["status"] == 429 and body["title"] == "Too many requests", body
    return body


def wrong_key() -> dict[str, str]:
    return {"Authorization": f"Bearer fu_{uuid.uuid4().hex}"}


@contextmanager
def serving(runtime: Runtime, **api: Any) -> Iterator[tuple[str, int]]:
    """The API over ``runtime`` (API settings changed by ``api``) under uvicorn as the CLI configures it,
    on a free port in a thread; its host and port."""
    runtime = with_api(runtime, **api)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = server.config(
        create_app(runtime), runtime.settings.api, host="127.0.0.1", port=0, access_log=False
    )
    uvicorn_server = uvicorn.Server(config)
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: uvicorn_server.started, what="uvicorn started")
    try:
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        uvicorn_server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def connect(address: tuple[str, int]) -> socket.socket:
    """A raw connection; a read that waits more than 10 s fails the test (never a condition of it)."""
    conn = socket.create_connection(address, timeout=10)
    return conn


def read_all(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := conn.recv(65_536):
        data += chunk
    return data


def raw_status(address: tuple[str, int], request: bytes) -> int:
    """The status of one raw HTTP/1.1 request (sent with ``Connection: close``)."""
    with closing(connect(address)) as conn:
        conn.sendall(request)
        answer = read_all(conn)
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


# --- the limiter's table -----------------------------------------------------------------------------------


def test_a_rate_allows_its_burst_then_one_per_interval() -> None:
    rate = Rate(per_minute=6, max_entries=10)
    assert [rate.take("a", 0.0) for _ in range(6)] == [0.0] * 6
    assert rate.take("a", 0.0) == pytest.approx(10.0)  # one more every 10 s
    assert rate.take("b", 0.0) == 0.0  # another key has its own
    assert rate.take("a", 9.0) == pytest.approx(1.0)
    assert rate.take("a", 10.0) == 0.0
    assert rate.take("a", 10.0) == pytest.approx(10.0)


def test_a_rate_remembers_at_most_its_entries_and_forgets_the_least_recently_charged() -> None:
    rate = Rate(per_minute=1, max_entries=100)
    rate.charge("kept", 0.0)
    for n in range(10_000):
        rate.charge(f"random-{n}", 1.0)
        if n % 50 == 0:
            rate.charge("kept", 1.0)  # charged again: moves to the back of the line
    assert len(rate) == 100
    assert rate.wait("kept", 1.0) > 0
    assert rate.wait("random-0", 1.0) == 0.0  # forgotten


# --- throttling through the application --------------------------------------------------------------------


def test_wrong_bearer_keys_from_one_address_are_429_after_the_limit_even_with_the_right_key(
    api_app: Litestar, runtime: Runtime, project: Project, clock: ManualClock
) -> None:
    before = throttled("auth_failures")
    with limited_client(api_app, runtime, auth_failures_per_minute=5) as client:
        for _ in range(5):
            assert client.get("/v1/contacts", headers=wrong_key()).status_code == 401
        body = assert_429(client.get("/v1/contacts", headers=wrong_key()), retry_after=12)
        assert "auth failures" in body["detail"]
        assert_429(client.get("/v1/contacts", headers=project.headers))
        # a request without a key is not guessing: answered as before
        assert client.get("/v1/contacts").status_code == 401
        assert client.get("/health").status_code == 200
        clock.advance(timedelta(seconds=12))
        assert client.get("/v1/contacts", headers=project.headers).status_code == 200
        assert client.get("/v1/contacts", headers=wrong_key()).status_code == 401
        assert_429(client.get("/v1/contacts", headers=wrong_key()))
    assert throttled("auth_failures") == before + 3


def test_failed_sign_ins_from_one_address_are_429_after_the_limit(
    api_app: Litestar, runtime: Runtime, project: Project, clock: ManualClock
) -> None:
    before = throttled("signin_failures")
    with limited_client(api_app, runtime, signin_failures_per_minute=3) as client:
        form = client.get("/app/sign-in").text
        token = form.split('name="_csrf" value="')[1].split('"')[0]
        wrong = {"_csrf": token, "api_key": "fu_wrong", "next": "/app/"}
        for _ in range(3):
            assert client.post("/app/sign-in", data=wrong, follow_redirects=False).status_code == 401
        right = wrong | {"api_key": project.api_key}
        assert_429(client.post("/app/sign-in", data=right, follow_redirects=False), retry_after=20)
        # the REST API is another limit: the address has guessed no bearer key
        assert client.get("/v1/contacts", headers=project.headers).status_code == 200
        clock.advance(timedelta(seconds=20))
        assert client.post("/app/sign-in", data=right, follow_redirects=False).status_code == 303
    assert throttled("signin_failures") == before + 1


def test_each_key_has_a_request_rate_keyed_by_its_hash(
    api_app: Litestar,
    runtime: Runtime,
    project: Project,
    other_project: Project,
    clock: ManualClock,
) -> None:
    before = throttled("key_requests")
    bound = with_api(runtime, key_requests_per_minute=3)
    with client_of(api_app, bound) as client:
        for _ in range(3):
            assert client.get("/v1/contacts", headers=project.headers).status_code == 200
        body = assert_429(client.get("/v1/contacts", headers=project.headers), retry_after=20)
        assert "key requests" in body["detail"]
        assert client.get("/v1/contacts", headers=other_project.headers).status_code == 200
        clock.advance(timedelta(seconds=20))
        assert client.get("/v1/contacts", headers=project.headers).status_code == 200
        assert_429(client.get("/v1/contacts", headers=project.headers))
        tables = api_app.state.limits.tables(bound)
        remembered = set(tables.key_requests._until)
    assert throttled("key_requests") == before + 2
    assert hashlib.sha256(project.api_key.encode()).hexdigest() in remembered
    assert not any(project.api_key in key for key in remembered)  # never the key itself


def test_no_key_limit_when_it_is_zero(api_app: Litestar, runtime: Runtime, project: Project) -> None:
    with limited_client(api_app, runtime, key_requests_per_minute=0) as client:
        statuses = {client.get("/v1/contacts", headers=project.headers).status_code for _ in range(50)}
    assert statuses == {200}


def test_random_keys_cannot_grow_the_limiter_beyond_its_entries(api_app: Litestar, runtime: Runtime) -> None:
    bound = with_api(runtime, limiter_max_entries=20, auth_failures_per_minute=1000)
    with client_of(api_app, bound) as client:
        for _ in range(60):
            assert client.get("/v1/contacts", headers=wrong_key()).status_code == 401
        tables = api_app.state.limits.tables(bound)
        assert len(tables.key_requests) == 20


def test_the_limits_are_documented_on_every_authenticated_operation() -> None:
    document = create_app(Runtime.__new__(Runtime)).openapi_schema.to_schema()
    operation = document["paths"]["/v1/contacts"]["get"]
    assert "Retry-After" in operation["responses"]["429"]["headers"]
    assert "429" not in document["paths"]["/health"]["get"]["responses"]


def test_a_new_runtime_starts_with_empty_tables(runtime: Runtime) -> None:
    limits = Limits()
    first = limits.tables(runtime)
    assert limits.tables(runtime) is first
    assert limits.tables(with_api(runtime)) is not first
