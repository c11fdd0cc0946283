"""The OpenAPI document is complete: every operation's errors as problem details (one shared component),
the bearer requirement where a key is needed and none on the system routes, the alternative successes, and
every bound the server enforces on a request body; and docs/api.md states the limits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from libs.common.contracts import limits
from services.api.openapi import _BOUNDS
from tests.test_api_contacts import assert_problem

PROBLEM = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
METHODS = ("get", "put", "post", "patch", "delete")
DOCS = Path(__file__).parent.parent / "docs" / "api.md"


@pytest.fixture(scope="module")
def document(api_app: Litestar) -> dict[str, Any]:
    schema: dict[str, Any] = api_app.openapi_schema.to_schema()
    return schema


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def test_the_served_document_is_the_completed_one(client: TestClient[Any], document: dict[str, Any]) -> None:
    served = client.get("/schema/openapi.json")
    assert served.status_code == 200, served.text
    assert served.json()["paths"] == document["paths"]
    assert served.json()["components"]["schemas"]["Problem"] == document["components"]["schemas"]["Problem"]


def test_every_error_is_a_problem_of_the_shared_component(document: dict[str, Any]) -> None:
    problem = document["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail"}
    assert {"code", "errors"} <= set(problem["properties"])
    for method, path, operation in operations(document):
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                assert response["content"] == PROBLEM, (method, path, status)
                assert response["description"], (method, path, status)


def test_a_problem_body_has_what_the_component_requires(
    client: TestClient[Any], document: dict[str, Any]
) -> None:
    problem = document["components"]["schemas"]["Problem"]
    body = assert_problem(client.post("/v1/contacts", json={"phone": "nope"}), 422, "phone")
    assert set(problem["required"]) <= set(body) <= set(problem["properties"])
    error_fields = set(problem["properties"]["errors"]["items"]["required"])
    assert all(set(error) == error_fields for error in body["errors"])


def test_operations_under_v1_need_a_key_and_the_system_ones_none(document: dict[str, Any]) -> None:
    assert {"bearer": []} in document["security"]
    for method, path, operation in operations(document):
        if path.startswith("/v1/providers/"):  # a provider's webhook: its signature, not a key
            assert operation["security"] == [], (method, path)
            assert ("401" if method.upper() == "POST" else "403") in operation["responses"], (method, path)
        elif path.startswith("/v1/"):
            assert operation["security"] == [{"bearer": []}], (method, path)
            unauthorized = operation["responses"]["401"]
            assert "WWW-Authenticate" in unauthorized["headers"], (method, path)
            assert "Retry-After" in operation["responses"]["503"]["headers"], (method, path)
        else:
            assert operation["security"] == [], (method, path)
            assert "401" not in operation["responses"], (method, path)
    assert {path for _, path, _ in operations(document) if not path.startswith("/v1/")} >= {
        "/health",
        "/ready",
    }
    assert "503" in document["paths"]["/ready"]["get"]["responses"]


def test_the_statuses_follow_what_an_operation_takes(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        statuses = set(operation["responses"])
        if "requestBody" in operation:
            assert {"400", "413", "422"} <= statuses, (method, path)
        if "{" in path:
            assert "404" in statuses, (method, path)
        if any(parameter["in"] == "query" for parameter in operation.get("parameters", [])):
            assert {"400", "422"} <= statuses, (method, path)


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("POST", "/v1/contacts", {"201", "409"}),
        ("PUT", "/v1/contacts/by-phone/{phone}", {"200", "201"}),
        ("POST", "/v1/enrollments", {"200", "201", "404", "409"}),
        ("POST", "/v1/enrollments/{enrollment_id}/stop", {"200", "409"}),
        ("PATCH", "/v1/sequences/{sequence_id}", {"200", "409"}),
        ("POST", "/v1/sequences/{sequence_id}/publish", {"201", "409", "422"}),
        ("POST", "/v1/sequences/{sequence_id}/archive", {"200", "409"}),
        ("POST", "/v1/events", {"200", "201", "404", "409"}),
        ("POST", "/v1/conversations/{conversation_id}/follow-up", {"200", "201", "409"}),
        ("POST", "/v1/bulk-enrollments", {"200", "202", "404", "409"}),
        ("POST", "/v1/numbers", {"201", "409"}),
    ],
)
def test_an_operation_documents_its_other_outcomes(
    document: dict[str, Any], method: str, path: str, statuses: set[str]
) -> None:
    assert statuses <= set(document["paths"][path][method.lower()]["responses"])


def test_list_responses_name_what_their_items_are(document: dict[str, Any]) -> None:
    listed = document["paths"]["/v1/contacts"]["get"]["responses"]["200"]["content"]["application/json"]
    page = document["components"]["schemas"][listed["schema"]["$ref"].rsplit("/", 1)[1]]
    assert page["properties"]["items"]["items"] == {"$ref": "#/components/schemas/Contact"}
    assert set(page["required"]) == {"items", "next"}


def test_the_documented_bounds_are_the_enforced_ones(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert schemas["MessageStep"]["properties"]["text"]["maxLength"] == limits.MAX_MESSAGE_LENGTH
    assert schemas["Definition"]["properties"]["steps"]["maxItems"] == 50
    assert schemas["InboundMessage"]["properties"]["provider_message_id"]["maxLength"] == 256
    attributes = schemas["ConversationUpdated"]["properties"]["attributes"]
    assert attributes["maxProperties"] == limits.MAX_ATTRIBUTES
    assert attributes["propertyNames"]["maxLength"] == limits.MAX_KEY_LENGTH
    parameters = {p["name"]: p["schema"] for p in document["paths"]["/v1/contacts"]["get"]["parameters"]}
    assert (parameters["limit"]["minimum"], parameters["limit"]["maximum"]) == (1, 500)
    assert parameters["tag"]["minLength"] == 1  # an empty tag filter is refused


def test_every_bound_msgspec_checks_on_a_request_body_is_in_the_document(
    api_app: Litestar, document: dict[str, Any]
) -> None:
    """msgspec's own JSON Schema of the request bodies is the reference: each bound it states for a field of
    a struct is stated by the document's component of that struct too."""
    bodies = [
        handler.parsed_fn_signature.parameters["data"].annotation
        for route in api_app.routes
        if isinstance(route, HTTPRoute)
        for handler in route.route_handlers
        if "data" in handler.parsed_fn_signature.parameters
    ]
    _, definitions = msgspec.json.schema_components(bodies)
    missing = []
    for name, definition in definitions.items():
        component = document["components"]["schemas"].get(name)
        if component is None:
            continue
        for field, expected in definition.get("properties", {}).items():
            stated = _bounds(component["properties"][field])
            missing += [(name, field, bound) for bound in _bounds(expected) - stated]
    assert not missing


def _bounds(schema: Any, where: str = "") -> set[tuple[str, str, str]]:
    """Every (place, keyword, value) bound in ``schema``; a nullable branch is looked through."""
    found: set[tuple[str, str, str]] = set()
    if isinstance(schema, list):
        for item in schema:
            found |= _bounds(item, where)
    elif isinstance(schema, dict):
        for keyword, value in schema.items():
            if keyword in _BOUNDS:
                found.add((where, keyword, repr(float(value) if isinstance(value, int | float) else value)))
            elif keyword in ("anyOf", "oneOf"):
                found |= _bounds(value, where)
            elif keyword in ("items", "propertyNames"):
                found |= _bounds(value, f"{where}/{keyword}")
    return found


def test_docs_state_every_limit() -> None:
    section = DOCS.read_text().split("## Limits", 1)[1].split("\n## ", 1)[0]
    for name in dir(limits):
        if name.startswith("MAX_"):
            value = getattr(limits, name)
            shown = {f"{value:,}", str(value), f"{value // 1024} KB"}
            assert any(re.search(rf"(?<![\d,]){re.escape(s)}(?![\d,])", section) for s in shown), name
