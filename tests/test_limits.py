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
import time
import uuid
from collections.abc import Iterator
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
from libs.common.core.settings import Settings, SettingsError
from services.api import server
from services.api.app import create_app
from services.api.limits import Limits, Rate
from services.api.problems import PROBLEM_JSON
from tests.conftest import Project, client_of
from tests.helpers import followups, wait_until

# --- helpers -----------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def limits_on_the_test_clock(api_app: Litestar, clock: ManualClock) -> Iterator[None]:
    """The shared app's limiter paced by the test's clock (in production: the monotonic clock), so a test
    moves time past a Retry-After instead of sleeping through it."""
    before = api_app.state.limits
    api_app.state.limits = Limits(timer=lambda: clock.now().timestamp())
    yield
    api_app.state.limits = before


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
    try:
        while chunk := conn.recv(65_536):
            data += chunk
    except ConnectionResetError:  # closed while data of ours was unread: closed all the same
        pass
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


# --- deadlines over real sockets ---------------------------------------------------------------------------

DEADLINES = {"header_timeout_seconds": 0.5, "body_timeout_seconds": 0.5}


def test_connections_that_sent_half_a_header_are_closed_at_the_header_deadline(runtime: Runtime) -> None:
    with serving(runtime, **DEADLINES) as address:
        connections = []
        for _ in range(350):  # as many as the issue found still open after 30 s
            conn = connect(address)
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\nX-Slow: ")
            connections.append(conn)
        # each read returns once the server closed the connection (nothing answered: no request was asked)
        assert [read_all(conn) for conn in connections] == [b""] * 350
        for conn in connections:
            conn.close()
        # a connection that opened and sent nothing is closed the same
        with closing(connect(address)) as idle:
            assert read_all(idle) == b""


def test_a_second_request_late_with_its_headers_is_closed_after_the_first_is_answered(
    runtime: Runtime,
) -> None:
    with serving(runtime, **DEADLINES) as address, closing(connect(address)) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        first = b""
        while b"\r\n\r\n" not in first or not first.endswith(b'"ok"}'):
            first += conn.recv(65_536)
        assert first.startswith(b"HTTP/1.1 200 ")
        conn.sendall(b"GET /health HTTP/1.1\r\nHo")
        assert read_all(conn) == b""


def test_a_request_that_sent_half_its_body_is_answered_408_and_closed_at_the_body_deadline(
    runtime: Runtime, project: Project
) -> None:
    head = (
        "POST /v1/contacts HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {project.api_key}\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    with serving(runtime, **DEADLINES) as address:
        connections = []
        for _ in range(100):
            conn = connect(address)
            conn.sendall(head + b'{"phone": "+1415')
            connections.append(conn)
        answers = [read_all(conn) for conn in connections]
        for conn in connections:
            conn.close()
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert body["status"] == 408 and body["title"] == "Request timeout", body
        # and on a route that never reads its body (the body deadline runs after the answer too)
        with closing(connect(address)) as conn:
            conn.sendall(b"POST /nowhere HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n{")
            answer = read_all(conn)
        assert answer.startswith(b"HTTP/1.1 404 ") or answer.startswith(b"HTTP/1.1 405 "), answer[:200]


def test_a_body_sent_after_its_answer_ends_the_body_deadline(runtime: Runtime) -> None:
    """A request may be answered before its body is read (a method the path does not take is 405); the
    body that follows completes it, and the connection then awaits the next request's headers."""
    head = (
        b"POST /health HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n"
    )
    with (
        serving(runtime, header_timeout_seconds=30, body_timeout_seconds=0.5) as address,
        closing(connect(address)) as conn,
    ):
        conn.sendall(head)
        answer = b""
        while not answer.endswith(b"}"):
            answer += conn.recv(65_536)
        assert answer.startswith(b"HTTP/1.1 405 "), answer
        conn.sendall(b'{"phone": "+14155550123"}\r\n')
        time.sleep(1)  # past the body deadline: it must no longer run
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        assert read_all(conn).startswith(b"HTTP/1.1 200 ")


def test_a_request_in_time_is_served_over_a_kept_alive_connection(runtime: Runtime, project: Project) -> None:
    with (
        serving(runtime, header_timeout_seconds=5, body_timeout_seconds=5) as (host, port),
        httpx.Client(base_url=f"http://{host}:{port}", headers=project.headers) as client,
    ):
        created = client.post("/v1/contacts", json={"phone": "+14155550123"})
        assert created.status_code in (200, 201), created.text
        assert [client.get("/v1/contacts").status_code for _ in range(5)] == [200] * 5


# --- the client address: the socket's peer, X-Forwarded-For from trusted proxies only ----------------------


def _wrong_key_statuses(address: tuple[str, int], forwarded_for: str, count: int) -> list[int]:
    request = (
        f"GET /v1/contacts HTTP/1.1\r\nHost: test\r\nConnection: close\r\nX-Forwarded-For: {forwarded_for}"
        f"\r\nAuthorization: Bearer fu_{uuid.uuid4().hex}\r\n\r\n"
    ).encode()
    return [raw_status(address, request) for _ in range(count)]


def test_x_forwarded_for_names_the_client_only_behind_a_trusted_proxy(runtime: Runtime) -> None:
    # the default trusts a proxy on the same host (the test's peer is 127.0.0.1)
    with serving(runtime, auth_failures_per_minute=3) as address:
        assert _wrong_key_statuses(address, "203.0.113.7", 4) == [401, 401, 401, 429]
        # another client behind the same proxy has its own allowance
        assert _wrong_key_statuses(address, "198.51.100.1, 203.0.113.8", 3) == [401, 401, 401]
        # what a client wrote in front of the address its proxy appended is not taken
        assert _wrong_key_statuses(address, "198.51.100.99, 203.0.113.7", 1) == [429]
    for untrusted in ("none", "192.0.2.1"):
        with serving(runtime, auth_failures_per_minute=3, trusted_proxies=untrusted) as address:
            # every forwarded address is the one peer, 127.0.0.1
            statuses = [_wrong_key_statuses(address, f"203.0.113.{n}", 1)[0] for n in range(4)]
            assert statuses == [401, 401, 401, 429], untrusted


# --- no 500 on any header value ----------------------------------------------------------------------------

ODD_VALUES = [
    b"",
    b" ",
    b"\x00",
    b"\x01\x02\x7f",
    b"\xff\xfe\xfd",
    "é😀".encode(),
    b"a\rb",
    b"a\nb",
    b"a\r\nX-Injected: 1",
    b"\t\t",
    b"%00%0d%0a",
    b"=" * 10,
    b";;;,,,",
    b'"',
    b"x" * 60_000,
    b"Bearer",
    b"Bearer ",
    b"Bearer \xff\xfe",
    b"Bearer " + b"k" * 50_000,
    b"Basic Zm9vOmJhcg==",
    b"bearer\tfu_x",
    b"a=b; c; =d; followups_session=\xff; followups_csrf=",
    b"multipart/form-data; boundary=",
    b"multipart/form-data; boundary=\xff",
    b"application/json; charset=nonsense",
    b"application/x-www-form-urlencoded; charset=\xff",
    b"text/plain; ;;",
    b"999.999.999.999, ::ffff:zz, unknown",
    b"-1",
    b"18446744073709551616",
    b"websocket",
    b"100-continue",
    b"https",
]
HEADERS = [
    b"Authorization",
    b"Cookie",
    b"Content-Type",
    b"X-Forwarded-For",
    b"Accept",
    b"Accept-Encoding",
    b"Host",
    b"If-None-Match",
    b"Origin",
    b"Referer",
    b"User-Agent",
    b"X-CSRF-Token",
    b"HX-Request",
    b"Range",
    b"Content-Encoding",
    b"Transfer-Encoding",
    b"Upgrade",
    b"Expect",
    b"X-Forwarded-Proto",
]
ROUTES = [
    (b"GET", b"/v1/contacts", b""),
    (b"POST", b"/v1/contacts", b'{"phone": "+14155550123"}'),
    (b"GET", b"/health", b""),
    (b"GET", b"/metrics", b""),
    (b"GET", b"/app/sign-in", b""),
    (b"POST", b"/app/sign-in", b"api_key=x&_csrf=y"),
    (b"GET", b"/app/sequences", b""),
    (b"GET", b"/schema/openapi.json", b""),
]


def test_no_forwarded_for_value_is_answered_500_behind_a_trusted_proxy(
    runtime: Runtime, project: Project
) -> None:
    with serving(runtime, auth_failures_per_minute=100_000) as address:  # a trusted peer by default
        for value in [*ODD_VALUES, b"[::1", b"[::1]:x", b"1.2.3.4:99999", b"::1, , ,", b"unknown:0"]:
            for path in (b"/v1/contacts", b"/health"):
                request = (
                    b"GET " + path + b" HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
                    b"Authorization: Bearer " + project.api_key.encode() + b"\r\n"
                    b"X-Forwarded-For: " + value + b"\r\n\r\n"
                )
                status = raw_status(address, request)
                assert status < 500, (path, value[:80], status)


def test_no_header_value_is_answered_500(runtime: Runtime, project: Project) -> None:
    seen: dict[int, int] = {}
    with serving(runtime, auth_failures_per_minute=100_000, signin_failures_per_minute=100_000) as address:
        for method, path, body in ROUTES:
            for name in HEADERS:
                for value in ODD_VALUES:
                    headers = [
                        b"Host: test",
                        b"Connection: close",
                        f"Content-Length: {len(body)}".encode(),
                    ]
                    if name != b"Authorization":
                        headers.append(f"Authorization: Bearer {project.api_key}".encode())
                    if name != b"Content-Type" and body:
                        kind = (
                            b"application/json"
                            if body.startswith(b"{")
                            else b"application/x-www-form-urlencoded"
                        )
                        headers.append(b"Content-Type: " + kind)
                    headers = [h for h in headers if not h.lower().startswith(name.lower() + b":")]
                    headers.append(name + b": " + value)
                    request = (
                        method + b" " + path + b" HTTP/1.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body
                    )
                    status = raw_status(address, request)
                    seen[status] = seen.get(status, 0) + 1
                    assert status < 500, (method, path, name, value[:80], status)
    assert 400 in seen and 401 in seen and 200 in seen, seen  # the values reached the handlers too


# --- /metrics: behind METRICS_TOKEN, or on a port of its own ----------------------------------------------

METRICS_TOKEN = "m" * 12 + uuid.uuid4().hex


def test_metrics_need_the_token_when_one_is_set(api_app: Litestar, runtime: Runtime) -> None:
    with limited_client(api_app, runtime, metrics_token=METRICS_TOKEN) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/metrics", headers={"Authorization": f"Basic {METRICS_TOKEN}"}).status_code == 401
        served = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        assert served.status_code == 200
        assert "followups_api_throttled_total" in served.text
    with limited_client(api_app, runtime) as client:  # no token: public, as before
        assert client.get("/metrics").status_code == 200


def test_wrong_metrics_tokens_count_as_wrong_keys(api_app: Litestar, runtime: Runtime) -> None:
    with limited_client(api_app, runtime, metrics_token=METRICS_TOKEN, auth_failures_per_minute=2) as client:
        for _ in range(2):
            assert client.get("/metrics", headers={"Authorization": "Bearer guess"}).status_code == 401
        assert_429(client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}))


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_metrics_on_their_own_port_are_not_on_the_api_port(api_app: Litestar, runtime: Runtime) -> None:
    port = _free_port()
    with limited_client(api_app, runtime, metrics_port=port) as client:
        assert client.get("/metrics").status_code == 404
        serve_metrics(port)  # what `followups api` starts with API_METRICS_PORT set
        exposed = wait_until(lambda: _metrics_text(port), what="metrics served on their port")
        assert exposed is not None and "followups_api_throttled_total" in exposed


def _metrics_text(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.TransportError:
        return None


# --- settings ----------------------------------------------------------------------------------------------


def test_the_limits_settings_are_read_and_checked() -> None:
    settings = Settings.from_env(
        {
            "API_KEY_REQUESTS_PER_MINUTE": "0",
            "API_TRUSTED_PROXIES": "10.0.0.1, 192.168.0.0/16, ::1",
            "API_HEADER_TIMEOUT_SECONDS": "2.5",
            "METRICS_TOKEN": METRICS_TOKEN,
            "API_METRICS_PORT": "9400",
        }
    ).api
    assert settings.key_requests_per_minute == 0
    assert settings.trusted_proxies == "10.0.0.1, 192.168.0.0/16, ::1"
    assert settings.header_timeout_seconds == 2.5
    assert (settings.metrics_token, settings.metrics_port) == (METRICS_TOKEN, 9400)
    for name, value in [
        ("API_TRUSTED_PROXIES", "proxy.internal"),
        ("API_TRUSTED_PROXIES", "none, 10.0.0.1"),
        ("API_SIGNIN_FAILURES_PER_MINUTE", "0"),
        ("API_KEY_REQUESTS_PER_MINUTE", "-1"),
        ("API_LIMITER_MAX_ENTRIES", "0"),
        ("API_BODY_TIMEOUT_SECONDS", "0"),
        ("API_METRICS_PORT", "70000"),
    ]:
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: value})
    with pytest.raises(SettingsError, match="METRICS_TOKEN") as error:
        Settings.from_env({"METRICS_TOKEN": "short-secret"})
    assert "short-secret" not in str(error.value)


# --- `followups api` serves with all of it ----------------------------------------------------------------


def _answers(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.TransportError:
        return None


def test_followups_api_serves_with_the_deadlines_and_the_metrics_port(db_url: str, amqp_url: str) -> None:
    port, metrics_port = _free_port(), _free_port()
    env = {
        "DATABASE_URL": db_url,
        "AMQP_URL": amqp_url,
        "API_PORT": str(port),
        "API_HEADER_TIMEOUT_SECONDS": "0.5",
        "API_METRICS_PORT": str(metrics_port),
        "LOG_JSON": "true",
    }
    api = followups("api", env=env)
    try:
        health = wait_until(lambda: _answers(f"http://127.0.0.1:{port}/health"), timeout=30, what="api up")
        assert health is not None and health.status_code == 200
        with closing(connect(("127.0.0.1", port))) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: te")
            assert read_all(conn) == b""
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 404
        exposed = wait_until(lambda: _metrics_text(metrics_port), what="metrics on their port")
        assert exposed is not None and "followups_api_throttled_total" in exposed
    finally:
        code = api.stop()
    assert "connection closed: request headers late" in api.output, api.output
    assert code == 0, api.output  # SIGTERM stops it cleanly (its pool closed), not killed by the signal
