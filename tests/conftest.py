"""Test fixtures: real PostgreSQL (a template database per run, a fresh database per test) and RabbitMQ.

Without ``DATABASE_URL`` the session starts an embedded PostgreSQL (pgserver) itself. RabbitMQ tests
(``amqp_url``) are skipped when none is reachable, and fail when ``CI`` is set.

The API app is built once per session (per xdist worker); each test's ``client`` points it at that test's
runtime. Multi-process tests (``slow``) run first, so xdist spreads the quick tests around them.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from litestar import Litestar
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.broker import create_broker
from libs.common.core.clock import ManualClock
from libs.common.core.db import create_pool
from libs.common.core.migrate import migrate
from libs.common.core.runtime import Runtime
from libs.common.core.settings import BrokerSettings, DatabaseSettings, Settings
from libs.common.platform.projects import create_project
from libs.common.rules import egress
from services.api.app import create_app
from tests.helpers import Ingress

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
#: The queue type of the tests on that RabbitMQ (the machine's own): it holds the queues of earlier runs,
#: declared classic before quorum queues became the default, and a queue cannot change type in place. The
#: processes the tests start inherit it; quorum queues are tested on a cluster of their own
#: (tests/test_rabbitmq_cluster.py).
SHARED_QUEUE_TYPE = "classic"
os.environ.setdefault("AMQP_QUEUE_TYPE", SHARED_QUEUE_TYPE)
#: The tests' webhook receivers listen on this host: the suite opens loopback to webhooks (as an operator
#: would for a local receiver); tests/test_webhook_isolation.py proves the default denies it.
TEST_WEBHOOK_ALLOWED_NETWORKS = "127.0.0.0/8,::1/128"


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` (works for host and socket URLs alike)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The multi-process (``slow``) tests first: each takes many times longer than any other test, and
    started last they would leave one xdist worker running them long after the others ran out of tests."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


#: Free space a RAM disk needs for the embedded cluster to live there (the cluster's WAL alone may grow to
#: max_wal_size, 1 GB, between checkpoints).
RAM_DISK_MIN_FREE = 2 * 2**30


def _ram_disk() -> str | None:
    """A tmpfs for the embedded cluster, when there is one with room enough (else the default temp folder).

    Every test creates and drops a database of a few hundred files. On ext4, after many such drops, each
    new file's inode allocation scans for recently deleted inodes, and CREATE DATABASE came to cost ~150 ms
    of CPU; on tmpfs it is ~10 ms. (Docker's default /dev/shm is 64 MB: too small, so not used.)"""
    folder = "/dev/shm"
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < RAM_DISK_MIN_FREE or not os.access(folder, os.W_OK):
        return None
    return folder


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A PostgreSQL server: DATABASE_URL, or an embedded one started for this session."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    import pgserver

    folder = tempfile.mkdtemp(prefix="followups-test-pg-", dir=_ram_disk())
    server = pgserver.get_server(folder, cleanup_mode="delete")
    url = str(server.get_uri())
    with psycopg.connect(url, autocommit=True) as conn:
        # a throwaway cluster: no crash safety needed, which makes CREATE DATABASE ~20x cheaper
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield url
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    """A database migrated once per session, cloned for every test."""
    name = f"followups_tmpl_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    migrate(with_database(server_url, name))
    yield name
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def database_from(server_url: str, template: str) -> Iterator[str]:
    """The name of a new database copied from ``template`` (CREATE DATABASE ... TEMPLATE), dropped after."""
    name = f"followups_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
        # the test database need not survive a crash: commit without waiting for the WAL flush
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    try:
        yield name
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(server_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    with database_from(server_url, template_db) as name:
        yield with_database(server_url, name)


@pytest.fixture(autouse=True)
def webhook_networks() -> Iterator[None]:
    """Every test starts with loopback open to webhooks (the tests' receivers), as the settings say."""
    egress.configure(TEST_WEBHOOK_ALLOWED_NETWORKS)
    yield
    egress.configure(TEST_WEBHOOK_ALLOWED_NETWORKS)


@pytest.fixture
def settings(db_url: str) -> Settings:
    base = Settings.from_env({"WEBHOOK_ALLOWED_NETWORKS": TEST_WEBHOOK_ALLOWED_NETWORKS})
    return replace(base, database=DatabaseSettings(url=db_url, pool_min_size=1, pool_max_size=8))


@pytest.fixture
def pool(settings: Settings) -> Iterator[ConnectionPool]:
    pool = create_pool(settings.database, name="followups-test")
    yield pool
    pool.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def runtime(settings: Settings, pool: ConnectionPool, clock: ManualClock) -> Iterator[Runtime]:
    broker = create_broker(BrokerSettings(), embedded=True)
    yield Runtime(settings, pool, broker, clock)
    broker.close()


@dataclass(frozen=True)
class Project:
    id: uuid.UUID
    api_key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@pytest.fixture
def project(pool: ConnectionPool) -> Project:
    with pool.connection() as conn:
        new = create_project(conn, "test project")
    return Project(new.project_id, new.api_key)


@pytest.fixture
def other_project(pool: ConnectionPool) -> Project:
    with pool.connection() as conn:
        new = create_project(conn, "another project")
    return Project(new.project_id, new.api_key)


class _Unbound:
    """The runtime of the session's app between tests: any use fails loudly."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API app is used outside a test's client fixture (runtime.{name})")


UNBOUND = cast(Runtime, _Unbound())


@pytest.fixture(scope="session")
def api_app() -> Litestar:
    """The API app, built once per session: building it costs ~40 ms, more than most API tests take.

    Its handlers read the runtime from ``app.state`` on every request (``services.api.deps.runtime_of``),
    so ``client`` binds it to the test's runtime (database, broker, clock) for the test's duration."""
    return create_app(UNBOUND)


@contextmanager
def client_of(app: Litestar, runtime: Runtime) -> Iterator[TestClient[Any]]:
    """A client of the session's ``app`` over ``runtime``, for as long as the block runs."""
    app.state.runtime = runtime
    try:
        with TestClient(app=app) as client:
            yield client
    finally:
        app.state.runtime = UNBOUND


@pytest.fixture
def client(api_app: Litestar, runtime: Runtime, project: Project) -> Iterator[TestClient[Any]]:
    """An API client authenticated as ``project``."""
    with client_of(api_app, runtime) as client:
        client.headers.update(project.headers)
        yield client


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """A reachable RabbitMQ: skipped locally when there is none, a failure under CI."""
    url = os.environ.get("AMQP_URL", DEFAULT_AMQP_URL)
    if not _reachable(url):
        if os.environ.get("CI"):
            pytest.fail(f"RabbitMQ is not reachable at {url} and CI is set")
        pytest.skip(f"RabbitMQ is not reachable at {url}")
    return url


@pytest.fixture
def ingress(runtime: Runtime) -> Iterator[Ingress]:
    started = Ingress(runtime)
    started.worker.start()
    yield started
    started.worker.stop()


# --- the dashboard: a client signed in through its form ----------------------------------------------------


def csrf_of(page: str) -> str:
    found = re.search(r'name="_csrf" value="([^"]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


def sign_in(client: TestClient[Any], project: Project) -> str:
    """Sign ``client`` in as ``project``; the CSRF token of its session."""
    form = client.get("/app/sign-in")
    response = client.post(
        "/app/sign-in",
        data={"_csrf": csrf_of(form.text), "api_key": project.api_key, "next": "/app/rules"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/app/rules"
    return csrf_of(client.get("/app/rules").text)


@pytest.fixture
def app_client(api_app: Litestar, runtime: Runtime) -> Iterator[TestClient[Any]]:
    with client_of(api_app, runtime) as client:
        yield client


@pytest.fixture
def signed_in(app_client: TestClient[Any], project: Project) -> tuple[TestClient[Any], str]:
    """A client signed in as ``project``, and its CSRF token."""
    return app_client, sign_in(app_client, project)
