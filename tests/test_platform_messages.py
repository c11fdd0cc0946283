"""Outbound messages and platform events: ``message.status`` reports (idempotent, monotonic, a failed
send final), the send lane's claims (by priority then age, never twice), and the lock order between an
inbound message and an agent reply in one conversation."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.runtime import Runtime
from libs.common.platform.messages import OutboundMessage, queue_contact_message
from libs.common.platform.send_lane import ClaimRequest, claim_messages
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment
from tests.helpers import rows, wait_until
from tests.platform_event_helpers import message_of, one, outbox, post_event, release, sequence_with

# --- message.status --------------------------------------------------------------------------------------


def queued_message(
    pool: ConnectionPool,
    project_id: uuid.UUID,
    contact: uuid.UUID,
    *,
    priority: int = 5,
    now: Any = None,
    body: str = "hi",
) -> uuid.UUID:
    with pool.connection() as conn:
        queued = queue_contact_message(
            conn,
            OutboundMessage(
                project_id=project_id, contact_id=contact, body=body, source="api", priority=priority
            ),
            now=now or datetime(2030, 1, 1, tzinfo=UTC),
        )
    return queued.message_id


def test_status_reports_are_idempotent_and_monotonic(
    client: TestClient[Any], runtime: Runtime, project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence_with(pool, project.id), contact).id
    release(runtime)
    message = message_of(pool, enrollment)[0]
    assert client.post("/v1/send-lane/claim", json={"limit": 1}).json()["items"][0]["id"] == str(message)

    def report(status: str, expected: int = 200, **fields: Any) -> dict[str, Any]:
        fields.setdefault("message_id", str(message))
        return post_event(client, {"type": "message.status", "status": status, **fields}, expected)

    sent = report("SENT", provider_message_id="wamid.out.1")
    assert (sent["applied"], sent["status"]) == (True, "SENT")
    assert report("SENT")["applied"] is False  # a repeat
    delivered = report("DELIVERED", message_id=None, provider_message_id="wamid.out.1")  # by provider id
    assert (delivered["applied"], delivered["status"], delivered["message_id"]) == (
        True,
        "DELIVERED",
        str(message),
    )
    assert report("READ")["applied"] is True
    with caplog.at_level(logging.WARNING, logger="libs.common.platform.send_lane"):
        late = report("SENT")
        failed = report("FAILED", error="too late")
    assert (late["applied"], late["status"]) == (False, "READ")
    assert (failed["applied"], failed["status"]) == (False, "READ")
    ignored = [r for r in caplog.records if "backwards" in r.getMessage()]
    assert [(r.current, r.reported) for r in ignored] == [("READ", "SENT"), ("READ", "FAILED")]  # type: ignore[attr-defined]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="libs.common.platform.send_lane"):
        assert report("READ")["applied"] is False  # a repeat is not a regression: not logged
    assert not [r for r in caplog.records if "backwards" in r.getMessage()]

    assert one(pool, "SELECT status, provider_message_id FROM messages WHERE id = %s", message) == (
        "READ",
        "wamid.out.1",
    )
    history = [
        r[0]
        for r in rows(
            pool, "SELECT status FROM message_status_events WHERE message_id = %s ORDER BY id", message
        )
    ]
    assert history == ["QUEUED", "PROCESSING", "SENT", "DELIVERED", "READ"]
    assert [e["status"] for e in outbox(pool, "message.sent")] == ["SENT"]
    assert len(outbox(pool, "message.delivered")) == 1 and len(outbox(pool, "message.read")) == 1


def test_a_failed_send_is_final(client: TestClient[Any], runtime: Runtime, project: Project) -> None:
    pool = runtime.pool
    message = queued_message(pool, project.id, make_contact(pool, project.id))
    client.post("/v1/send-lane/claim", json={"limit": 1})
    failed = post_event(
        client,
        {"type": "message.status", "status": "FAILED", "message_id": str(message), "error": "blocked"},
        200,
    )
    assert (failed["applied"], failed["status"]) == (True, "FAILED")
    late = post_event(
        client, {"type": "message.status", "status": "DELIVERED", "message_id": str(message)}, 200
    )
    assert (late["applied"], late["status"]) == (False, "FAILED")
    assert one(pool, "SELECT status, error FROM messages WHERE id = %s", message) == ("FAILED", "blocked")
    assert [e["error"] for e in outbox(pool, "message.failed")] == ["blocked"]


def test_a_status_report_for_an_unknown_or_foreign_message_is_404(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    pool = runtime.pool
    foreign = queued_message(pool, other_project.id, make_contact(pool, other_project.id))
    for message in (uuid.uuid4(), foreign):
        response = client.post(
            "/v1/events", json={"type": "message.status", "status": "SENT", "message_id": str(message)}
        )
        assert response.status_code == 404, response.text
        assert response.json()["errors"][0]["field"] == "message_id"
    response = client.post(
        "/v1/events", json={"type": "message.status", "status": "SENT", "provider_message_id": "nope"}
    )
    assert response.status_code == 404
    response = client.post("/v1/events", json={"type": "message.status", "status": "SENT"})
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "message_id"
    assert one(pool, "SELECT status FROM messages WHERE id = %s", foreign) == "QUEUED"


# --- the send lane ---------------------------------------------------------------------------------------


def test_the_send_lane_claims_by_priority_then_age_and_never_twice(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    old_low = queued_message(pool, project.id, contact, priority=5, now=t0)
    new_high = queued_message(pool, project.id, contact, priority=1, now=t0 + timedelta(minutes=2))
    new_low = queued_message(pool, project.id, contact, priority=5, now=t0 + timedelta(minutes=1))
    old_high = queued_message(pool, project.id, contact, priority=1, now=t0 - timedelta(minutes=1))
    foreign = queued_message(pool, other_project.id, make_contact(pool, other_project.id), priority=0)

    first = client.post("/v1/send-lane/claim", json={"limit": 3})
    second = client.post("/v1/send-lane/claim", json={"limit": 3})
    third = client.post("/v1/send-lane/claim", json={})

    assert first.status_code == second.status_code == 200
    assert [m["id"] for m in first.json()["items"]] == [str(old_high), str(new_high), str(old_low)]
    assert [m["id"] for m in second.json()["items"]] == [str(new_low)]
    assert third.json()["items"] == []
    item = first.json()["items"][0]
    assert item["contact_id"] == str(contact) and item["body"] == "hi" and item["phone"].startswith("+1555")
    statuses = dict(rows(pool, "SELECT id, status FROM messages"))
    assert {m for m, s in statuses.items() if s == "PROCESSING"} == {old_low, new_high, new_low, old_high}
    assert statuses[foreign] == "QUEUED"
    claimed_events = [e["message_id"] for e in outbox(pool, "message.claimed")]
    assert sorted(claimed_events) == sorted(str(m) for m in (old_low, new_high, new_low, old_high))
    # the other project's send lane sees only its own
    other = client.post("/v1/send-lane/claim", json={"limit": 10}, headers=other_project.headers)
    assert [m["id"] for m in other.json()["items"]] == [str(foreign)]


@pytest.mark.parametrize("body", [{"limit": 0}, {"limit": 501}, {"limit": "many"}, {"limt": 1}])
def test_a_bad_claim_is_refused_naming_the_field(client: TestClient[Any], body: dict[str, Any]) -> None:
    response = client.post("/v1/send-lane/claim", json=body)
    assert response.status_code in (400, 422), response.text
    assert response.json()["errors"][0]["field"] in ("limit", "limt")


# --- lock order ------------------------------------------------------------------------------------------


def _wait_until_blocked(pool: ConnectionPool, count: int, timeout: float = 10) -> None:
    """Until ``count`` sessions of the test's pool wait for a lock."""

    def blocked() -> bool:
        waiting: int = one(
            pool,
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        return waiting >= count

    wait_until(blocked, timeout=timeout, what=f"{count} sessions waiting for a lock")


def test_an_inbound_message_and_an_agent_reply_in_the_same_conversation_do_not_deadlock(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    """The reply path locks the contact, then the conversation; the inbox path locks the conversation, then
    (through the new message's foreign key) reads the contact. Neither may wait for the other in a cycle."""
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    conversation = post_event(client, {"type": "conversation.created", "contact_id": str(contact)}, 201)
    conversation_id = conversation["conversation_id"]
    results: dict[str, int] = {}

    def send(name: str, event: dict[str, Any]) -> None:
        results[name] = client.post("/v1/events", json=event).status_code

    human = threading.Thread(
        target=send, args=("human", {"type": "message.human", "conversation_id": conversation_id})
    )
    inbound = threading.Thread(
        target=send,
        args=("inbound", {"type": "message.inbound", "contact_id": str(contact), "provider_message_id": "i"}),
    )
    with pool.connection() as gate:
        # hold the conversation so the agent's reply queues up for it first ...
        gate.execute("SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,))
        human.start()
        _wait_until_blocked(pool, 1)
        # ... then the contact's message locks the contact and queues up behind it
        inbound.start()
        _wait_until_blocked(pool, 2)
    human.join(30)
    inbound.join(30)
    assert results == {"human": 201, "inbound": 201}
    assert one(pool, "SELECT count(*) FROM messages WHERE conversation_id = %s", conversation_id) == 2


def test_concurrent_claims_never_return_the_same_message(runtime: Runtime, project: Project) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    queued = {queued_message(pool, project.id, contact, now=t0 + timedelta(seconds=i)) for i in range(120)}
    claims: list[list[uuid.UUID]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def claimer() -> None:
        barrier.wait()
        while True:
            with pool.connection() as conn:
                got = [m.id for m in claim_messages(conn, project.id, ClaimRequest(limit=7), now=t0)]
            if not got:
                return
            with lock:
                claims.append(got)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    claimed = [m for batch in claims for m in batch]
    assert len(claimed) == len(set(claimed)) == len(queued)
    assert set(claimed) == queued
    assert one(pool, "SELECT count(*) FROM outbox WHERE type = 'message.claimed'") == len(queued)
