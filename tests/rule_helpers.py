"""What the rule tests share: creating rules, building conditions and actions, causing events through the
API, and running the triggers service's work."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from libs.common.rules.triggers import process_triggers


def create_rule(
    client: TestClient[Any],
    event: str,
    actions: list[dict[str, Any]],
    conditions: dict[str, Any] | None = None,
    **fields: Any,
) -> str:
    """A rule created through the API; its id."""
    body: dict[str, Any] = {"name": f"on {event}", "event": event, "actions": actions, **fields}
    if conditions is not None:
        body["conditions"] = conditions
    response = client.post("/v1/rules", json=body)
    assert response.status_code == 201, response.text
    rule_id: str = response.json()["id"]
    return rule_id


def leaf(attribute: str, operator: str, value: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"attribute": attribute, "operator": operator}
    if value is not None:
        out["value"] = value
    return out


def add_tag(*tags: str) -> dict[str, Any]:
    return {"type": "add_contact_tag", "tags": list(tags)}


def add_label(*labels: str) -> dict[str, Any]:
    return {"type": "add_label", "labels": list(labels)}


def post_event(client: TestClient[Any], event: dict[str, Any], expected: int | None = None) -> dict[str, Any]:
    """A platform event through ``POST /v1/events``; its result."""
    response = client.post("/v1/events", json=event)
    assert response.status_code < 300, response.text
    if expected is not None:
        assert response.status_code == expected, response.text
    body: dict[str, Any] = response.json()
    return body


def process(runtime: Runtime) -> int:
    """The triggers service's work until no trigger is due: how many triggers it claimed."""
    total = 0
    for _ in range(20):
        claimed = process_triggers(runtime.pool, runtime.clock).triggers
        if claimed == 0:
            return total
        total += claimed
    raise AssertionError("process_triggers never ran out of due triggers")
