"""Liveness, readiness, metrics, the OpenAPI document, and problem details for routing errors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.broker import create_broker
from libs.common.core.clock import ManualClock
from libs.common.core.db import create_pool
from libs.common.core.runtime import Runtime
from libs.common.core.settings import BrokerSettings, DatabaseSettings, Settings
from tests.conftest import client_of

PROBLEM_JSON = "application/problem+json"
UNREACHABLE = DatabaseSettings(url="postgresql://postgres@127.0.0.1:1/x?connect_timeout=1", pool_min_size=1)

CONTACT_PATHS = {
    "/v1/contacts": {"get", "post"},
    "/v1/contacts/by-phone/{phone}": {"put"},
    "/v1/contacts/{contact_id}": {"get", "patch"},
    "/v1/contacts/{contact_id}/tags": {"post"},
    "/v1/contacts/{contact_id}/tags/{tag}": {"delete"},
}


@pytest.fixture
def anonymous(api_app: Litestar, runtime: Runtime) -> Iterator[TestClient[Any]]:
    """A client without an API key."""
    with client_of(api_app, runtime) as client:
        yield client


def _client_over(api_app: Litestar, pool: ConnectionPool, settings: Settings) -> Iterator[TestClient[Any]]:
    broker = create_broker(BrokerSettings(), embedded=True)
    runtime = Runtime(replace(settings, database=UNREACHABLE), pool, broker, ManualClock())
    try:
        with client_of(api_app, runtime) as client:
            yield client
    finally:
        broker.close()
        pool.close()


@pytest.fixture
def closed_pool_client(api_app: Litestar, settings: Settings) -> Iterator[TestClient[Any]]:
    """An API whose pool was never opened."""
    yield from _client_over(api_app, create_pool(UNREACHABLE, name="followups-closed", open_=False), settings)


@pytest.fixture
def unreachable_client(api_app: Litestar, settings: Settings) -> Iterator[TestClient[Any]]:
    """An API whose pool is open but whose server does not answer (the database went away)."""
    pool = create_pool(UNREACHABLE, name="followups-unreachable", open_=False)
    pool.open(wait=False)
    yield from _client_over(api_app, pool, settings)


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"] and body["title"] and body["detail"]
    return body


# --- liveness and readiness


def test_health_answers_without_an_api_key(anonymous: TestClient[Any]) -> None:
    response = anonymous.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_ready_answers_when_the_database_does(anonymous: TestClient[Any]) -> None:
    response = anonymous.get("/ready")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready"}


@pytest.mark.parametrize("which", ["closed_pool_client", "unreachable_client"])
def test_ready_is_a_prompt_503_problem_when_the_database_is_unreachable(
    request: pytest.FixtureRequest, which: str
) -> None:
    client: TestClient[Any] = request.getfixturevalue(which)
    started = time.monotonic()
    response = client.get("/ready")
    assert time.monotonic() - started < 10
    body = assert_problem(response, 503)
    assert "database" in body["detail"]
    # liveness does not depend on the database
    assert client.get("/health").status_code == 200


def test_an_api_call_while_the_database_is_unreachable_is_503_not_500(
    closed_pool_client: TestClient[Any],
) -> None:
    response = closed_pool_client.get("/v1/contacts", headers={"Authorization": "Bearer fu_whatever"})
    assert_problem(response, 503)


# --- metrics


def test_metrics_is_prometheus_text_with_the_followup_series(anonymous: TestClient[Any]) -> None:
    response = anonymous.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "version=" in response.headers["content-type"]
    text = response.text
    assert "# TYPE whatstig_followup_steps_total counter" in text
    assert "# HELP whatstig_followup_steps_total" in text
    assert "# TYPE whatstig_followup_release_lag_seconds histogram" in text
    assert "whatstig_followup_enrollments_total" in text


def test_metrics_content_type_is_parseable_by_prometheus(anonymous: TestClient[Any]) -> None:
    content_type = anonymous.get("/metrics").headers["content-type"]
    names = [part.split("=", 1)[0].strip().lower() for part in content_type.split(";")[1:]]
    assert len(names) == len(set(names)), content_type  # Go's mime.ParseMediaType refuses duplicates


# --- OpenAPI


def test_openapi_lists_the_contact_routes_and_declares_bearer_security(anonymous: TestClient[Any]) -> None:
    response = anonymous.get("/schema/openapi.json")
    assert response.status_code == 200, response.text
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for path, methods in CONTACT_PATHS.items():
        assert path in schema["paths"], sorted(schema["paths"])
        assert methods <= set(schema["paths"][path]), (path, schema["paths"][path].keys())
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert {"bearer": []} in schema["security"]
    assert "/health" in schema["paths"] and "/ready" in schema["paths"]

    create = schema["paths"]["/v1/contacts"]["post"]
    assert "201" in create["responses"]
    body_schema = create["requestBody"]["content"]["application/json"]["schema"]
    assert "$ref" in body_schema or "properties" in body_schema


# --- routing errors are problem details too


def test_an_unknown_route_is_a_404_problem(client: TestClient[Any]) -> None:
    assert_problem(client.get("/v1/nothing-here"), 404)


def test_a_wrong_method_is_a_405_problem(client: TestClient[Any]) -> None:
    response = client.put("/v1/contacts", json={})
    assert_problem(response, 405)
