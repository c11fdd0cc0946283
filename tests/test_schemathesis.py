"""The whole OpenAPI document, fuzzed in process with schemathesis under every check it has: no operation
answers a 5xx, every response (its status, content type, headers and body) is one the document describes,
no request the document allows is refused (``positive_data_acceptance``: the document says exactly what the
API takes, unknown fields and patterns included) and none it forbids is accepted.

Each operation is a test of its own (spread over the xdist workers), over a fresh database holding one
resource of each kind; the generated ids are often replaced by those, so that the operations run beyond
their 404. Requests carry a valid API key, so authenticated operations run beyond their 401. Examples are
bounded (``MAX_EXAMPLES`` generated cases per operation, valid and invalid ones mixed, plus the schema's own
examples) so the file runs in well under two minutes on two cores. The examples are derandomized: the same
ones on every run of the same code, so CI does not fail by chance; a deeper search sets a seed of its own
(``pytest tests/test_schemathesis.py --hypothesis-seed=N``) or more examples.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import TestClient
from schemathesis.checks import CheckFunction
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import positive_data_acceptance

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

#: The app under test: its own instance, as schemathesis keeps its lifespan running until the process exits
#: (two lifespans at once on the session's ``api_app`` would share, and leak, its event emitter's stream).
FUZZED = create_app(UNBOUND)

schema = schemathesis.openapi.from_dict(
    FUZZED.openapi_schema.to_schema(),
    config=schemathesis.config.SchemathesisConfig.from_dict(
        {
            # strings as JSON carries them (UTF-8: no lone surrogate) and as PostgreSQL stores them (no NUL
            # character: refused with 422 everywhere, docs/api.md, Conventions)
            "generation": {"max-examples": MAX_EXAMPLES, "mode": "all", "codec": "utf-8", "allow-x00": False},
            # the coverage phase enumerates boundary cases for every field, unbounded by max-examples
            "phases": {"coverage": {"enabled": False}},
        }
    ),
)
#: Refusals of schema-valid requests that JSON Schema cannot state, by operation: the fields (a regex of
#: the problem's ``errors[].field``) whose refusal breaks no promise of the document. Any other refusal of
#: a schema-valid request fails (``positive_data_acceptance``).
BEYOND_SCHEMA = {
    # a time that must be in the future
    "POST /v1/api-keys": r"expires_at",
    # one of two fields (either / or), or a field that goes only with another, checked together; a
    # one-off's own steps are published as they come (the publish checks: a text or instructions not blank,
    # a placeholder's fallback, ...), which a definition's schema, shared with drafts, cannot state
    "POST /v1/enrollments": r"sequence_id|steps(\.\d+\..+)?|stop_on",
    # (and a segment's condition tree)
    "POST /v1/bulk-enrollments": r"(segment|contact_ids|phones)(\..*)?|anchor_at|anchor_attribute",
    "POST /v1/events": r"contact_id|phone|message_id|provider_message_id",
    "POST /v1/conversations/{conversation_id}/follow-up": r"media_url|media_kind",  # each needs the other
    "GET /v1/messages": r"created_before|created_after",  # a time range: the end after the start
    # a condition tree (its attributes and operators depend on the rule's event); a webhook's host that is
    # a literal address the server does not call (a private one, say)
    "POST /v1/rules": r"conditions(\..*)?|actions\.\d+\.url|delay_in_business_hours",
    "PATCH /v1/rules/{rule_id}": r"conditions(\..*)?|actions\.\d+\.url|delay_in_business_hours",
    # a conversation an event of the rule's type never has (or lacks, the contact having no open one); the
    # event's data over 16 KB as JSON
    "POST /v1/rules/{rule_id}/dry-run": r"conversation_id|event",
    # a preview's contact by id or else by phone (either / or); a time that must be ahead (not past, within
    # a year); an anchor the steps' offsets take off the calendar; variables as enroll refuses them
    "POST /v1/sequences/{sequence_id}/preview": r"contact_id|phone|enrolled_at|anchor_at|variables(\..*)?",
    # an experiment the sequence's current version runs, and one of its split's variants
    "POST /v1/sequences/{sequence_id}/experiments/{experiment}/winner": r"experiment|variant",
    # a send window whose start and end are the same time (one that never closes); a time zone its pattern
    # admits that the time zone database does not know
    "PUT /v1/settings": r"send_window|business_hours|timezone",
    "POST /v1/sequences": r"definition(\.steps\.\d+)?\.send_window",
    "PATCH /v1/sequences/{sequence_id}": r"definition(\.steps\.\d+)?\.send_window",
}
#: A float where an integer is expected: JSON Schema counts 2.0 as an integer, the API (strict) does not
#: (libs/common/core/decoding.py words msgspec's "Expected `int`, got `float`").
INTEGRAL_FLOAT = re.compile(r".+ must be a whole number( or null)?, not a number with a decimal point")

schema.app = FUZZED  # the checks that send requests of their own (``ignored_auth``) send them in process too


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
    derandomize=True,  # see the module
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.filter_too_much,  # the tag pattern's lookaheads: few strings pass
    ],
)
def test_every_operation_answers_as_documented(
    case: schemathesis.Case[Any],
    use_known: bool,
    runtime: Runtime,
    project: Project,
    known: dict[str, str],
) -> None:
    # the ids of existing resources in place of generated ones, so the operation runs beyond its 404; never
    # where the case is meant to be invalid (a known id would make it valid, and its acceptance right)
    if use_known and case.path_parameters and not _negative(case, ParameterLocation.PATH):
        case.path_parameters = {name: known.get(name, value) for name, value in case.path_parameters.items()}
    if use_known and isinstance(case.body, dict) and not _negative(case, ParameterLocation.BODY):
        case.body = {
            name: known[name] if isinstance(value, str) and name in known else value
            for name, value in case.body.items()
        }
    # a case without its API key (the security requirement negated) goes without it
    headers = None if _negative(case, ParameterLocation.HEADER) else project.headers
    FUZZED.state.runtime = runtime
    try:
        response = case.call(headers=headers)
        excluded: list[CheckFunction] = (
            [positive_data_acceptance] if _beyond_schema(case, response.status_code, response.text) else []
        )
        case.validate_response(response, headers=headers, excluded_checks=excluded)  # every other check
    finally:
        FUZZED.state.runtime = UNBOUND


def _negative(case: schemathesis.Case[Any], location: ParameterLocation) -> bool:
    """Whether the case was generated to be invalid in ``location``."""
    component = case.meta.components.get(location) if case.meta is not None else None
    return component is not None and component.mode.is_negative


def _beyond_schema(case: schemathesis.Case[Any], status: int, text: str) -> bool:
    """Whether a refusal names only what :data:`BEYOND_SCHEMA` lets the operation refuse."""
    if status not in (400, 422):
        return False
    errors = json.loads(text).get("errors") or []
    fields = BEYOND_SCHEMA.get(f"{case.method.upper()} {case.path}")
    return bool(errors) and all(
        INTEGRAL_FLOAT.fullmatch(e["message"]) or (fields is not None and re.fullmatch(fields, e["field"]))
        for e in errors
    )
