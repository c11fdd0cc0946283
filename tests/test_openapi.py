"""The OpenAPI document is complete: every operation's errors as problem details (one shared component),
the bearer requirement where a key is needed and none on the system routes, the alternative successes, and
every bound the server enforces on a request body; and docs/api.md states the limits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from libs.common.contracts import limits
from libs.common.core.reasons import OTHER
from libs.common.followups.release_step import StepRunReason
from libs.common.followups.templates import MissingValue
from libs.common.followups.transitions import EnrollmentReason, WaitingReason
from libs.common.rules.actions import RuleRefusal
from libs.common.rules.bulk import BulkSkipReason
from libs.common.rules.executions import SkipReason
from libs.common.rules.runs import RuleRunOutcome
from services.api.openapi import _BOUNDS, _RENAMED
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
        ("POST", "/v1/sequences/{sequence_id}/experiments/{experiment}/winner", {"200", "201", "409", "422"}),
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


def _request_structs(api_app: Litestar) -> dict[str, dict[str, Any]]:
    bodies = [
        handler.parsed_fn_signature.parameters["data"].annotation
        for route in api_app.routes
        if isinstance(route, HTTPRoute)
        for handler in route.route_handlers
        if "data" in handler.parsed_fn_signature.parameters
    ]
    definitions: dict[str, dict[str, Any]] = msgspec.json.schema_components(bodies)[1]
    return definitions


def test_a_body_that_refuses_unknown_fields_says_so(api_app: Litestar, document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    strict = [name for name, d in _request_structs(api_app).items() if d.get("additionalProperties") is False]
    assert {"ContactUpdate", "ContactCreate", "Definition", "MessageStep", "RuleCreate"} <= set(strict)
    named = [_RENAMED.get(name, name) for name in strict]
    assert [name for name in named if schemas[name].get("additionalProperties") is not False] == []


def test_an_unknown_field_is_refused_as_the_document_says(client: TestClient[Any]) -> None:
    created = client.post("/v1/contacts", json={"phone": "+14155550100"}).json()
    assert_problem(client.patch(f"/v1/contacts/{created['id']}", json={"": None}), 400, "body")


def test_patterns_and_bounds_of_validated_strings(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    phone = schemas["ContactCreate"]["properties"]["phone"]
    assert re.fullmatch(phone["pattern"], "+14155550123") and not re.search(phone["pattern"], "0")
    tag = schemas["TagsChange"]["properties"]["tags"]["items"]
    assert re.search(tag["pattern"], "vip") and not re.search(tag["pattern"], "-vip")
    assert "Europe/Lisbon" in schemas["ContactCreate"]["properties"]["timezone"]["oneOf"][0]["enum"]
    follow_up = schemas["FollowUpRequest"]["properties"]
    assert (follow_up["text"]["minLength"], follow_up["text"]["maxLength"]) == (1, limits.MAX_MESSAGE_LENGTH)
    assert follow_up["delay_seconds"]["minimum"] == 0
    assert follow_up["dedupe_key"]["maxLength"] == limits.MAX_DEDUPE_KEY_LENGTH
    assert schemas["StopRequest"]["properties"]["note"]["maxLength"] == limits.MAX_STOP_NOTE_LENGTH
    actions = schemas["RuleCreate"]["properties"]["actions"]
    assert (actions["minItems"], actions["maxItems"]) == (1, limits.MAX_RULE_ACTIONS)
    labels = schemas["AddLabel"]["properties"]["labels"]
    assert (labels["minItems"], labels["maxItems"]) == (1, limits.MAX_ACTION_LABELS)
    variables = schemas["EnrollRequest"]["properties"]["variables"]
    assert variables["maxProperties"] == limits.MAX_VARIABLES
    assert variables["propertyNames"] == {
        "type": "string",
        "minLength": 1,
        "maxLength": limits.MAX_KEY_LENGTH,
    }
    parameters = {p["name"]: p for p in document["paths"]["/v1/bulk-enrollments"]["post"]["parameters"]}
    assert parameters["Idempotency-Key"]["in"] == "header"


@pytest.mark.parametrize(
    ("variables", "field"),
    [({f"k{i}": 1 for i in range(limits.MAX_VARIABLES + 1)}, "variables"), ({"k" * 100: 1}, "variables.")],
)
def test_variables_beyond_their_limits_are_refused(
    client: TestClient[Any], variables: dict[str, Any], field: str
) -> None:
    contact = client.post("/v1/contacts", json={"phone": "+14155550100"}).json()
    step = {"kind": "message", "text": "Hi"}
    sequence = client.post("/v1/sequences", json={"name": "s", "definition": {"steps": [step]}}).json()
    client.post(f"/v1/sequences/{sequence['id']}/publish")
    body = {"contact_id": contact["id"], "sequence_id": sequence["id"], "variables": variables}
    refused = client.post("/v1/enrollments", json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["errors"][0]["field"].startswith(field)


def test_names_enums_and_typed_answers_a_generator_can_use(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert [name for name in schemas if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", name)] == []
    assert "ContactPage" in schemas and "ClaimedMessageItems" in schemas
    assert schemas["ContactPage"]["properties"]["next"]["oneOf"][0] == {"type": "string", "format": "uuid"}
    nullable_enums = [
        (name, field)
        for name, schema in schemas.items()
        for field, prop in schema.get("properties", {}).items()
        if isinstance(prop.get("type"), list) and "enum" in prop
    ]
    assert nullable_enums == []  # spelled as oneOf: the enum, or null
    assert schemas["Sequence"]["properties"]["draft"] == {"$ref": "#/components/schemas/Definition"}
    assert schemas["Version"]["properties"]["definition"] == {"$ref": "#/components/schemas/Definition"}
    assert set(schemas["Enrollment"]["properties"]["status"]["enum"]) >= {"active", "stopped", "completed"}
    assert schemas["StepRun"]["properties"]["outcome"]["enum"] == ["queued", "skipped", "branched"]
    # the closed sets of codes an answer holds: every stop, failure and pause reason the code writes
    assert _enum(schemas["Enrollment"]["properties"]["reason"]) == set(get_args(EnrollmentReason))
    assert _enum(schemas["Enrollment"]["properties"]["waiting_reason"]) == set(get_args(WaitingReason))
    assert _enum(schemas["EventResult"]["properties"]["stop_reason"]) == set(get_args(EnrollmentReason))
    # a step run's, an execution's and a rule run's reason: the codes the product writes, and ``other`` for
    # a stored one this version does not know; the detail apart, a string
    step_run, execution, run = (schemas[name]["properties"] for name in ("StepRun", "Execution", "RuleRun"))
    assert _enum(step_run["reason"]) == set(get_args(StepRunReason)) | {OTHER}
    assert _enum(execution["skip_reason"]) == set(get_args(SkipReason)) | {OTHER}
    assert _enum(run["reason"]) == set(get_args(RuleRefusal)) | {OTHER}
    assert set(run["outcome"]["enum"]) == set(get_args(RuleRunOutcome))
    assert "detail" not in run
    for detail in (step_run["reason_detail"], execution["skip_detail"], run["reason_detail"]):
        assert detail == {"oneOf": [{"type": "string"}, {"type": "null"}]}
    assert set(schemas["DefinitionWarning"]["properties"]["skip_reason"]["enum"]) == set(
        get_args(MissingValue)
    )
    # a bulk job's skipped contacts are counted by reason: the keys are the enum
    skipped = schemas["BulkJob"]["properties"]["skipped"]
    assert set(skipped["propertyNames"]["enum"]) == set(get_args(BulkSkipReason)) | {OTHER}
    claim = document["paths"]["/v1/send-lane/claim"]["post"]["responses"]["200"]["content"][
        "application/json"
    ]
    assert claim["schema"] == {"$ref": "#/components/schemas/ClaimedMessageItems"}


def _enum(prop: dict[str, Any]) -> set[str]:
    """The values of a nullable enum (spelled as oneOf: the enum, or null)."""
    [values] = [branch["enum"] for branch in prop["oneOf"] if "enum" in branch]
    return set(values)


def test_options_names_every_method_of_its_path(client: TestClient[Any], document: dict[str, Any]) -> None:
    wrong, answered = {}, 0
    for path, item in document["paths"].items():
        url = re.sub(r"\{version\}", "1", path)  # the one integer in a path
        url = re.sub(r"\{[^}]+\}", "00000000-0000-4000-8000-000000000000", url)
        answer = client.options(url)
        declared = {method.upper() for method in item if method in METHODS} | {"OPTIONS"}
        allowed = {m.strip() for m in answer.headers.get("allow", "").split(",") if m.strip()}
        answered += answer.status_code == 204
        if answer.status_code == 204 and allowed != declared:
            wrong[path] = (sorted(allowed), sorted(declared))
    assert not wrong
    assert answered == len(document["paths"])
    assert client.options("/v1/bulk-enrollments").headers["allow"] == "GET, OPTIONS, POST"
