"""What the end-to-end rule tests share: contacts, tags and conversations made and read through the API,
the triggers and rule messages left in the database, the outcome counters, the project's settings
and the controllable clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from litestar.testing import TestClient
from prometheus_client import REGISTRY

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from tests.factories import new_phone
from tests.helpers import rows
from tests.rule_helpers import post_event


def new_contact(client: TestClient[Any], **fields: Any) -> str:
    response = client.post("/v1/contacts", json={"phone": new_phone(), **fields})
    assert response.status_code == 201, response.text
    contact_id: str = response.json()["id"]
    return contact_id


def contact_of(client: TestClient[Any], contact_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/contacts/{contact_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def tags_of(client: TestClient[Any], contact_id: str) -> set[str]:
    return set(contact_of(client, contact_id)["tags"])


def add_tags(client: TestClient[Any], contact_id: str, *tags: str) -> None:
    response = client.post(f"/v1/contacts/{contact_id}/tags", json={"tags": list(tags)})
    assert response.status_code == 200, response.text


def new_conversation(client: TestClient[Any], contact_id: str) -> str:
    result = post_event(client, {"type": "conversation.created", "contact_id": contact_id}, 201)
    conversation_id: str = result["conversation_id"]
    return conversation_id


def conversation_of(client: TestClient[Any], conversation_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/conversations/{conversation_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def runs(client: TestClient[Any], rule_id: str) -> list[tuple[str, str | None]]:
    """What the rule did, oldest first: (outcome, reason)."""
    response = client.get(f"/v1/rules/{rule_id}/runs")
    assert response.status_code == 200, response.text
    return [(run["outcome"], run["reason"]) for run in reversed(response.json()["items"])]


def trigger_count(runtime: Runtime, kind: str | None = None) -> int:
    [(count,)] = rows(
        runtime.pool, "SELECT count(*) FROM followup_triggers WHERE %s::text IS NULL OR type = %s", kind, kind
    )
    return int(count)


def unprocessed(runtime: Runtime) -> int:
    [(count,)] = rows(runtime.pool, "SELECT count(*) FROM followup_triggers WHERE processed_at IS NULL")
    return int(count)


def counted(kind: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value("whatstig_followup_triggers_total", {"type": kind, "outcome": outcome})
    return value or 0.0


def rule_messages(runtime: Runtime, contact_id: str) -> list[dict[str, Any]]:
    with runtime.pool.connection() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT id, conversation_id, direction, status, source, body, template_name, template_language,"
            " template_parameters FROM messages WHERE contact_id = %s AND source = 'rule'"
            " ORDER BY created_at, id",
            (contact_id,),
        ).fetchall()


def notes(runtime: Runtime, contact_id: str) -> list[dict[str, Any]]:
    """The contact's private notes, oldest first (their data)."""
    found = rows(
        runtime.pool,
        "SELECT data FROM activities WHERE contact_id = %s AND kind = 'private_note' ORDER BY id",
        contact_id,
    )
    return [row[0] for row in found]


def advance(runtime: Runtime, delta: timedelta) -> datetime:
    clock = runtime.clock
    assert isinstance(clock, ManualClock)
    return clock.advance(delta)


def put_settings(client: TestClient[Any], **settings: Any) -> None:
    response = client.put("/v1/settings", json=settings)
    assert response.status_code == 200, response.text
