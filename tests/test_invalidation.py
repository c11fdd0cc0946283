"""Cache invalidation across processes: a change committed by one process reaches the others within a
second over the RabbitMQ fanout (each cache's TTL covers RabbitMQ being down)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.invalidation import Invalidator, on_invalidation
from libs.common.core.runtime import Runtime
from libs.common.rules.rules import RuleCache
from tests.conftest import Project, client_of
from tests.helpers import rows, start_worker, wait_until


def test_without_rabbitmq_only_this_process_is_told() -> None:
    kind = f"test-{uuid.uuid4().hex[:8]}"
    told: list[uuid.UUID] = []
    on_invalidation(kind, told.append)
    project = uuid.uuid4()
    Invalidator(None).publish(kind, project)
    assert told == [project]


def test_an_unreachable_rabbitmq_costs_only_the_ttl() -> None:
    """Publishing never raises: this process forgets at once, the others when their TTL runs out."""
    kind = f"test-{uuid.uuid4().hex[:8]}"
    told: list[uuid.UUID] = []
    on_invalidation(kind, told.append)
    project = uuid.uuid4()
    Invalidator("amqp://guest:guest@127.0.0.1:1/%2F").publish(kind, project)
    assert told == [project]


@pytest.mark.rabbitmq
def test_every_listening_process_hears_a_change(amqp_url: str) -> None:
    kind = f"test-{uuid.uuid4().hex[:8]}"
    told: list[uuid.UUID] = []
    on_invalidation(kind, told.append)
    first, second = Invalidator(amqp_url), Invalidator(amqp_url)
    try:
        first.start()
        second.start()
        assert first.wait_ready(10) and second.wait_ready(10)
        project = uuid.uuid4()
        started = time.monotonic()
        first.publish(kind, project)
        # this process at once, then each listener (standing for two other processes) once
        wait_until(lambda: len(told) == 3, timeout=5, what="the change heard by both listeners")
        assert told == [project] * 3
        assert time.monotonic() - started < 1.0
    finally:
        first.stop()
        second.stop()


@pytest.fixture
def broadcasting_client(
    api_app: Litestar, runtime: Runtime, project: Project, amqp_url: str
) -> Iterator[TestClient[Any]]:
    """An API client whose process publishes its changes over RabbitMQ, as `followups api` does, on the
    wall clock (a worker process runs on it too)."""
    runtime.invalidator = Invalidator(amqp_url)
    runtime.clock = SYSTEM_CLOCK
    try:
        with client_of(api_app, runtime) as client:
            client.headers.update(project.headers)
            yield client
    finally:
        runtime.invalidator.stop()


@pytest.mark.rabbitmq
def test_a_rule_changed_through_the_api_is_used_by_a_running_worker_at_once(
    broadcasting_client: TestClient[Any], runtime: Runtime, db_url: str, amqp_url: str
) -> None:
    """The triggers worker cached the rule (its TTL is 30 s); the API's change reaches it within a second."""
    client = broadcasting_client
    rule = client.post(
        "/v1/rules",
        json={
            "name": "tag new contacts",
            "event": "contact.created",
            "actions": [{"type": "add_contact_tag", "tags": ["first"]}],
        },
    ).json()
    worker = start_worker("triggers", {"DATABASE_URL": db_url, "AMQP_URL": amqp_url})
    try:
        worker.wait_for("cache invalidation listening")
        worker.wait_for("services started")
        first = client.post("/v1/contacts", json={"phone": "+14155550101"}).json()
        wait_until(
            lambda: client.get(f"/v1/contacts/{first['id']}").json()["tags"] == ["first"],
            timeout=15,
            what="the worker ran the rule (and cached it)",
        )
        changed = client.patch(
            f"/v1/rules/{rule['id']}", json={"actions": [{"type": "add_contact_tag", "tags": ["second"]}]}
        )
        assert changed.status_code == 200, changed.text
        time.sleep(1.0)  # within a second, the worker has forgotten the old rule
        second = client.post("/v1/contacts", json={"phone": "+14155550102"}).json()
        wait_until(
            lambda: client.get(f"/v1/contacts/{second['id']}").json()["tags"] != [],
            timeout=15,
            what="the worker ran the rule for the second contact",
        )
        assert client.get(f"/v1/contacts/{second['id']}").json()["tags"] == ["second"]
        outcomes = rows(runtime.pool, "SELECT outcome FROM followup_triggers ORDER BY id")
        assert outcomes == [("processed",), ("processed",)]
    finally:
        assert worker.stop() == 0, worker.output


def test_without_an_invalidation_a_cached_rule_is_reloaded_after_the_ttl(
    pool: ConnectionPool, project: Project
) -> None:
    """RabbitMQ down: another process's change is seen once the cache's TTL has run out (30 s in
    production; a short one here)."""
    cache = RuleCache(ttl=0.2)
    with pool.connection() as conn:
        assert cache.rules(conn, project.id, "contact.created") == []
        conn.execute(
            "INSERT INTO rules (project_id, name, event, actions) VALUES (%s, 'r', 'contact.created', %s)",
            (project.id, '[{"type": "add_contact_tag", "tags": ["x"]}]'),
        )
        conn.commit()
        assert cache.rules(conn, project.id, "contact.created") == []  # still cached
        time.sleep(0.3)
        assert [rule.event for rule in cache.rules(conn, project.id, "contact.created")] == [
            "contact.created"
        ]
