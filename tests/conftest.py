"""Test fixtures: real PostgreSQL (a template database per run, a fresh database per test) and RabbitMQ.

Without ``DATABASE_URL`` the session starts an embedded PostgreSQL (pgserver) itself. RabbitMQ tests
(``amqp_url``) are skipped when none is reachable, and fail when ``CI`` is set.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.broker import create_broker
from libs.common.core.clock import ManualClock
from libs.common.core.db import create_pool
from libs.common.core.migrate import migrate
from libs.common.core.runtime import Runtime
from libs.common.core.settings import BrokerSettings, DatabaseSettings, Settings
from libs.common.platform.projects import create_project
from services.api.app import create_app

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` (works for host and socket URLs alike)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A PostgreSQL server: DATABASE_URL, or an embedded one started for this session."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    import pgserver

    folder = tempfile.mkdtemp(prefix="followups-test-pg-")
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


@pytest.fixture
def db_url(server_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test (CREATE DATABASE ... TEMPLATE)."""
    name = f"followups_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
        # the test database need not survive a crash: commit without waiting for the WAL flush
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    yield with_database(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def settings(db_url: str) -> Settings:
    base = Settings.from_env({})
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


@pytest.fixture
def client(runtime: Runtime, project: Project) -> Iterator[TestClient[Any]]:
    """An API client authenticated as ``project``."""
    with TestClient(app=create_app(runtime)) as client:
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
