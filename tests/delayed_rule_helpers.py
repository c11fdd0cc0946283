"""What the delayed rule tests share: the conditions and texts of seed 002's stories, the clock set to a
moment, contacts and conversations made and changed through the API, sweeping due executions, and reading
the executions, rule messages and counters back."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from litestar.testing import TestClient
from prometheus_client import REGISTRY

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.rules.executions import Swept, sweep
from tests.factories import new_phone
from tests.rule_helpers import add_label, create_rule, post_event, process
from tests.rule_trigger_helpers import conversation_of

PROBLEM_JSON = "application/problem+json"
STALE_AFTER = timedelta(days=1)
PENDING = {"attribute": "conversation.status", "operator": "equal_to", "value": "pending"}
OUTGOING = {"attribute": "message.type", "operator": "equal_to", "value": "outgoing"}
FOLLOW_UP = "Just checking in — did that solve it for you?"


def at(value: str) -> datetime:
    """A moment of the test calendar, in UTC (2030-01-07 is a Monday)."""
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def set_time(runtime: Runtime, value: str) -> None:
    clock = runtime.clock
    assert isinstance(clock, ManualClock)
    clock.set(at(value))


def send(text: str = FOLLOW_UP) -> dict[str, Any]:
    return {"type": "send_message", "text": text}


def patch_rule(client: TestClient[Any], rule_id: str, **fields: Any) -> dict[str, Any]:
    response = client.patch(f"/v1/rules/{rule_id}", json=fields)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def fire(runtime: Runtime, stale_after: timedelta = STALE_AFTER) -> Swept:
    """One sweep of the due delayed rules."""
    return sweep(runtime.pool, runtime.clock, stale_after=stale_after)


def new_contact(client: TestClient[Any]) -> str:
    response = client.post("/v1/contacts", json={"phone": new_phone()})
    assert response.status_code == 201, response.text
    contact_id: str = response.json()["id"]
    return contact_id


def new_conversation(client: TestClient[Any], contact_id: str | None = None) -> str:
    contact_id = contact_id or new_contact(client)
    result = post_event(client, {"type": "conversation.created", "contact_id": contact_id})
    conversation_id: str = result["conversation_id"]
    return conversation_id


def labels_of(client: TestClient[Any], conversation_id: str) -> list[str]:
    labels: list[str] = conversation_of(client, conversation_id)["labels"]
    return labels


def change_status(client: TestClient[Any], conversation_id: str, status: str) -> None:
    post_event(
        client, {"type": "conversation.status_changed", "conversation_id": conversation_id, "status": status}
    )


def private_note(client: TestClient[Any], conversation_id: str, text: str = "called, no answer") -> None:
    post_event(
        client, {"type": "conversation.updated", "conversation_id": conversation_id, "private_note": text}
    )


def customer_writes(client: TestClient[Any], contact_id: str, conversation_id: str | None = None) -> str:
    event: dict[str, Any] = {
        "type": "message.inbound",
        "contact_id": contact_id,
        "provider_message_id": f"in-{uuid.uuid4()}",
        "body": "hello",
    }
    if conversation_id is not None:
        event["conversation_id"] = conversation_id
    written: str = post_event(client, event)["conversation_id"]
    return written


def agent_replies(client: TestClient[Any], conversation_id: str) -> None:
    post_event(client, {"type": "message.human", "conversation_id": conversation_id, "body": "Try this"})


def executions_page(
    client: TestClient[Any], path: str, headers: dict[str, str] | None = None, **params: Any
) -> dict[str, Any]:
    response = client.get(path, params=params, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def of_rule(client: TestClient[Any], rule_id: str, **params: Any) -> list[dict[str, Any]]:
    """The rule's executions, newest first."""
    items: list[dict[str, Any]] = executions_page(client, f"/v1/rules/{rule_id}/executions", **params)[
        "items"
    ]
    return items


def of_conversation(client: TestClient[Any], conversation_id: str, **params: Any) -> list[dict[str, Any]]:
    """The conversation's executions, newest first."""
    path = f"/v1/conversations/{conversation_id}/rule-executions"
    items: list[dict[str, Any]] = executions_page(client, path, **params)["items"]
    return items


def due(execution: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(execution["due_at"])


def outcome(execution: dict[str, Any]) -> tuple[str, str | None]:
    return execution["status"], execution["skip_reason"]


def the_one(client: TestClient[Any], rule_id: str) -> dict[str, Any]:
    """The rule's only execution."""
    [execution] = of_rule(client, rule_id)
    return execution


def rule_messages(runtime: Runtime, contact_id: str) -> list[dict[str, Any]]:
    with runtime.pool.connection() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT id, conversation_id, direction, status, source, body FROM messages"
            " WHERE contact_id = %s AND source = 'rule' ORDER BY created_at, id",
            (uuid.UUID(contact_id),),
        ).fetchall()


def assert_problem(response: Any, status: int | tuple[int, ...], field: str) -> dict[str, Any]:
    """A problem-details body with ``status`` (one of them) naming ``field`` in ``errors``."""
    statuses = status if isinstance(status, tuple) else (status,)
    assert response.status_code in statuses, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body: dict[str, Any] = response.json()
    assert field in [error["field"] for error in body.get("errors", [])], body
    return body


def counted(outcome: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "whatstig_rule_executions_total", {"outcome": outcome, "reason": reason}
    )
    return value or 0.0


def stuck_in_pending_rule(client: TestClient[Any], delay: int = 240) -> str:
    return create_rule(
        client,
        "conversation.updated",
        [add_label("stale-pending")],
        PENDING,
        execution_delay_minutes=delay,
    )


def reply_chase_rule(client: TestClient[Any]) -> str:
    return create_rule(client, "message.created", [send(FOLLOW_UP)], OUTGOING, execution_delay_minutes=1440)


def pending_since_ten(client: TestClient[Any], runtime: Runtime, rule: str) -> str:
    """A conversation that went Pending at 10:00 (a row of ``rule`` due 14:00 with the 4 h delay)."""
    set_time(runtime, "2030-01-07T09:00")
    conversation = new_conversation(client)
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")
    process(runtime)
    return conversation
