"""Bad AI steps through the API: a value out of range or a missing field is refused naming the field, on
create (422 or 400), on publish and for an inline step of an enrollment."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from tests.test_api_sequences import assert_problem


def _ai(**fields: Any) -> dict[str, Any]:
    return {"kind": "ai", "instructions": "Ask about the quote", "fallback": {"kind": "skip"}} | fields


@pytest.mark.parametrize(
    ("step", "field"),
    [
        (_ai(min_confidence=1.5), "definition.steps.0.min_confidence"),
        (_ai(min_confidence=-0.1), "definition.steps.0.min_confidence"),
        (_ai(fallback={"kind": "retry"}), "definition.steps.0.fallback.kind"),
        (_ai(history_messages=51), "definition.steps.0.history_messages"),
    ],
)
def test_creating_an_ai_step_with_a_bad_value_is_422_naming_the_field(
    client: TestClient[Any], step: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/sequences", json={"name": "x", "definition": {"steps": [step]}})
    assert_problem(response, 422, field)


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({"kind": "ai", "fallback": {"kind": "skip"}}, "definition.steps.0.instructions"),
        ({"kind": "ai", "instructions": "Ask"}, "definition.steps.0.fallback"),
        (_ai(fallback={"kind": "template"}), "definition.steps.0.fallback.text"),
        (_ai(min_confidence="high"), "definition.steps.0.min_confidence"),
    ],
)
def test_creating_an_ai_step_missing_a_field_is_400_naming_it(
    client: TestClient[Any], step: dict[str, Any], field: str
) -> None:
    """A missing or mistyped field is a shape error (400), like a message step without its text."""
    response = client.post("/v1/sequences", json={"name": "x", "definition": {"steps": [step]}})
    assert_problem(response, 400, field)


@pytest.mark.parametrize(
    ("step", "field"),
    [
        (_ai(instructions="   "), "definition.steps.0.instructions"),
        (_ai(fallback={"kind": "template", "text": ""}), "definition.steps.0.fallback.text"),
        (_ai(language="Portuguese"), "definition.steps.0.language"),
    ],
)
def test_publishing_an_ai_step_with_empty_text_is_422_naming_the_field(
    client: TestClient[Any], step: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/sequences", json={"name": "x", "definition": {"steps": [step]}})
    assert response.status_code == 201, response.text
    sequence_id = response.json()["id"]
    assert_problem(client.post(f"/v1/sequences/{sequence_id}/publish"), 422, field)


def test_an_inline_ai_step_with_a_bad_value_is_422_naming_the_field(client: TestClient[Any]) -> None:
    contact = client.post("/v1/contacts", json={"phone": "+14155550999"}).json()["id"]
    response = client.post(
        "/v1/enrollments", json={"contact_id": contact, "steps": [_ai(min_confidence=1.5)]}
    )
    assert_problem(response, 422, "steps.0.min_confidence")
