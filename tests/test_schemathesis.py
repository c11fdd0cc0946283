"""The whole OpenAPI document, fuzzed in process with schemathesis: no operation answers a 5xx, and every
response (its status, content type, headers and body) is one the document describes.

Each operation is a test of its own (spread over the xdist workers), over a fresh database holding one
resource of each kind; the generated ids are often replaced by those, so that the operations run beyond
their 404. Requests carry a valid API key, so authenticated operations run beyond their 401. Examples are
bounded (``MAX_EXAMPLES`` generated cases per operation, valid and invalid ones mixed, plus the schema's own
examples) so the file runs in well under two minutes on two cores.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import TestClient
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from libs.common.core.runtime import Runtime
from services.api.app import create_app
from tests.conftest import UNBOUND, Project, client_of

#: Hypothesis warns when the global ``random`` state changes while it draws an example; here the connection
#: pool's own threads change it (psycopg_pool jitters the lifetime of each connection it opens), not the
#: strategies.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies:hypothesis.errors.HypothesisDeprecationWarning"
)

#: Generated cases per operation (valid and invalid ones mixed): enough to find the shallow bugs on every
#: run within CI's time; ``SCHEMATHESIS_MAX_EXAMPLES=500`` digs deeper by hand.
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "15"))

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

#: The app under test: its own instance, as schemathesis keeps its lifespan running until the process exits
#: (two lifespans at once on the session's ``api_app`` would share, and leak, its event emitter's stream).
FUZZED = create_app(UNBOUND)

schema = schemathesis.openapi.from_dict(
    FUZZED.openapi_schema.to_schema(),
    config=schemathesis.config.SchemathesisConfig.from_dict(
        {
            "generation": {"max-examples": MAX_EXAMPLES, "mode": "all"},
            # the coverage phase enumerates boundary cases for every field, unbounded by max-examples
            "phases": {"coverage": {"enabled": False}},
        }
    ),
)


@pytest.fixture
def known(
    request: pytest.FixtureRequest, api_app: Litestar, runtime: Runtime, project: Project
) -> Iterator[dict[str, str]]:
    """One resource of each kind, created through the API: parameter name -> id (none for a list or a
    system operation, which name no resource)."""
    operation = request.node.name.partition("[")[2]  # the test's id is its operation: "[POST /v1/contacts]"
    if operation.startswith("GET ") and "{" not in operation:
        yield {}
        return
    with client_of(api_app, runtime) as client:
        client.headers.update(project.headers)
        yield _seed(client)


def _created(client: TestClient[Any], method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    response = client.request(method, url, json=body)
    assert response.status_code in (200, 201, 202), response.text
    return response.json()


def _seed(client: TestClient[Any]) -> dict[str, str]:
    contact = _created(client, "POST", "/v1/contacts", {"phone": "+14155550100", "tags": ["vip"]})
    step = {"kind": "message", "text": 'Hello {{contact.name | "there"}}'}
    sequence = _created(client, "POST", "/v1/sequences", {"name": "fuzz", "definition": {"steps": [step]}})
    _created(client, "POST", f"/v1/sequences/{sequence['id']}/publish")
    enrollment = _created(
        client, "POST", "/v1/enrollments", {"sequence_id": sequence["id"], "contact_id": contact["id"]}
    )
    conversation = _created(
        client, "POST", "/v1/events", {"type": "conversation.created", "contact_id": contact["id"]}
    )
    inbound = _created(
        client,
        "POST",
        "/v1/events",
        {"type": "message.inbound", "contact_id": contact["id"], "provider_message_id": "fuzz", "body": "hi"},
    )
    number = _created(client, "POST", "/v1/numbers", {"phone": "+14155550199", "name": "main"})
    rule = _created(
        client,
        "POST",
        "/v1/rules",
        {
            "name": "fuzz",
            "event": "contact.tag_added",
            "actions": [{"type": "add_contact_tag", "tags": ["x"]}],
        },
    )
    job = _created(
        client,
        "POST",
        "/v1/bulk-enrollments",
        {"sequence_id": sequence["id"], "contact_ids": [contact["id"]]},
    )
    campaign = str(uuid.uuid4())
    _created(client, "PUT", f"/v1/campaigns/{campaign}", {"sequence_id": sequence["id"], "name": "fuzz"})
    key = _created(client, "POST", "/v1/api-keys", {"name": "fuzz", "scope": "write"})
    return {
        "contact_id": contact["id"],
        "sequence_id": sequence["id"],
        "enrollment_id": enrollment["id"],
        "conversation_id": conversation["conversation_id"],
        "number_id": number["id"],
        "message_id": inbound["message_id"],
        "rule_id": rule["id"],
        "job_id": job["id"],
        "campaign_id": campaign,
        "key_id": key["key"]["id"],
        "phone": contact["phone"],
        "tag": "vip",
    }


@schema.parametrize()
@schema.given(use_known=st.booleans())
@hypothesis.settings(
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow],
)
def test_every_operation_answers_as_documented(
    case: schemathesis.Case[Any],
    use_known: bool,
    runtime: Runtime,
    project: Project,
    known: dict[str, str],
) -> None:
    if use_known:
        # the ids of existing resources in place of generated ones, so the operation runs beyond its 404
        if case.path_parameters:
            case.path_parameters = {
                name: known.get(name, value) for name, value in case.path_parameters.items()
            }
        if isinstance(case.body, dict):
            case.body = {
                name: known[name] if isinstance(value, str) and name in known else value
                for name, value in case.body.items()
            }
    FUZZED.state.runtime = runtime
    try:
        case.call_and_validate(app=FUZZED, headers=project.headers, checks=CHECKS)
    finally:
        FUZZED.state.runtime = UNBOUND
