"""Platform events through ``POST /v1/events``: their effects, the stop paths they run, the send lane and the
conversation follow-up shortcut."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep, StopFlags
from libs.common.platform.messages import OutboundMessage, queue_contact_message
from libs.common.platform.send_lane import ClaimRequest, claim_messages
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence, new_phone
from tests.helpers import rows, wait_until

DAY = 86400

#: Each stop path's copied flag (as in ``stop_on``) and the reason it records.
FLAG_OF = {
    "replied": "reply",
    "human_message": "human_message",
    "opted_out": "opt_out",
    "lead_closed": "lead_closed",
    "conversation_resolved": "conversation_resolved",
}


def one(pool: ConnectionPool, sql: str, *params: Any) -> Any:
    found = rows(pool, sql, *params)
    assert len(found) == 1, found
    return found[0][0] if len(found[0]) == 1 else found[0]


def stopped_total(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "whatstig_followup_finished_total", {"status": "stopped", "reason": reason}
    )
    return value or 0.0


def release(runtime: Runtime) -> int:
    return release_batch(runtime.pool, runtime.clock, runtime.settings.followup)


def post_event(client: TestClient[Any], event: dict[str, Any], expected: int | None = None) -> dict[str, Any]:
    response = client.post("/v1/events", json=event)
    if expected is not None:
        assert response.status_code == expected, response.text
    body: dict[str, Any] = response.json()
    return body


def sequence_with(
    pool: ConnectionPool, project_id: uuid.UUID, *, steps: int = 2, **stop_on: bool
) -> uuid.UUID:
    """A sequence whose first message goes at once and (with ``steps=2``) a second a day later."""
    all_steps = [MessageStep(text="first"), MessageStep(text="second", delay_seconds=DAY)][:steps]
    return make_sequence(pool, project_id, *all_steps, stop_on=StopFlags(**stop_on))


def status_of(pool: ConnectionPool, enrollment_id: uuid.UUID) -> tuple[str, str | None]:
    found: tuple[str, str | None] = one(
        pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment_id
    )
    return found


def message_of(pool: ConnectionPool, enrollment_id: uuid.UUID) -> tuple[uuid.UUID, str]:
    found: tuple[uuid.UUID, str] = one(
        pool,
        "SELECT id, status FROM messages WHERE followup_enrollment_id = %s ORDER BY created_at DESC LIMIT 1",
        enrollment_id,
    )
    return found


def outbox(pool: ConnectionPool, type_: str) -> list[dict[str, Any]]:
    return [r[0] for r in rows(pool, "SELECT data FROM outbox WHERE type = %s ORDER BY id", type_)]


def failed_events(pool: ConnectionPool) -> dict[str, dict[str, Any]]:
    """``message.failed`` events by message id."""
    return {e["message_id"]: e for e in outbox(pool, "message.failed")}


class Setup:
    """One contact with follow-ups in every state a stop path cares about (messages QUEUED where sent)."""

    def __init__(self, client: TestClient[Any], runtime: Runtime, project: Project, flag: str) -> None:
        pool, clock = runtime.pool, runtime.clock
        self.contact = make_contact(pool, project.id, name="Ada", attributes={"plan": "gold"}, tags=["vip"])
        self.other_contact = make_contact(pool, project.id)
        on = sequence_with(pool, project.id)
        off = sequence_with(pool, project.id, **{flag: False})
        paused = sequence_with(pool, project.id)
        one_step = sequence_with(pool, project.id, steps=1)
        # stops: its flag is set; its first message is QUEUED
        self.stops = make_enrollment(pool, clock, project.id, on, self.contact).id
        # does not stop: the sequence's flag for this path is off
        self.keeps = make_enrollment(pool, clock, project.id, off, self.contact).id
        # completes at once; its last message stays QUEUED
        self.completed = make_enrollment(pool, clock, project.id, one_step, self.contact).id
        # another contact's follow-up is never touched
        self.bystander = make_enrollment(pool, clock, project.id, on, self.other_contact).id
        assert release(runtime) == 4
        # paused after its first message (by hand): a paused enrollment stops too
        self.paused = make_enrollment(pool, clock, project.id, paused, self.contact).id
        assert release(runtime) == 1
        response = client.post(f"/v1/enrollments/{self.paused}/pause")
        assert response.status_code == 200, response.text
        assert status_of(pool, self.completed) == ("completed", None)
        self.conversation: uuid.UUID = one(
            pool, "SELECT DISTINCT conversation_id FROM messages WHERE contact_id = %s", self.contact
        )


def trigger(client: TestClient[Any], pool: ConnectionPool, reason: str, setup: Setup) -> dict[str, Any]:
    """Send the event of stop path ``reason`` for the setup's contact."""
    contact = str(setup.contact)
    if reason == "replied":
        return post_event(
            client, {"type": "message.inbound", "contact_id": contact, "provider_message_id": "in-1"}, 201
        )
    if reason == "human_message":
        return post_event(
            client, {"type": "message.human", "conversation_id": str(setup.conversation), "body": "hi"}, 201
        )
    if reason == "opted_out":
        return post_event(client, {"type": "contact.opted_out", "contact_id": contact}, 200)
    if reason == "lead_closed":
        lead = post_event(client, {"type": "lead.created", "contact_id": contact}, 201)
        return post_event(client, {"type": "lead.closed", "lead_id": lead["lead_id"], "status": "won"}, 200)
    if reason == "conversation_resolved":
        return post_event(
            client, {"type": "conversation.resolved", "conversation_id": str(setup.conversation)}, 200
        )
    assert reason == "contact_erased"
    return post_event(client, {"type": "contact.erased", "contact_id": contact}, 200)


@pytest.mark.parametrize("reason", [*FLAG_OF, "contact_erased"])
def test_each_stop_path_stops_flagged_follow_ups_and_cancels_their_queued_messages(
    client: TestClient[Any], runtime: Runtime, project: Project, reason: str
) -> None:
    pool = runtime.pool
    # Given a contact with a follow-up that stops on this path, one whose flag is off, a paused one and a
    # completed one whose last message is still QUEUED
    setup = Setup(client, runtime, project, FLAG_OF.get(reason, "reply"))
    stopped_before = stopped_total(reason)
    messages = {e: message_of(pool, e)[0] for e in (setup.stops, setup.keeps, setup.completed, setup.paused)}
    bystander_message = message_of(pool, setup.bystander)[0]

    # When the event arrives
    result = trigger(client, pool, reason, setup)

    # Then exactly the flagged live follow-ups are stopped, with the path's reason ...
    erased = reason == "contact_erased"
    expected_stopped = {setup.stops, setup.paused} | ({setup.keeps} if erased else set())
    assert set(map(uuid.UUID, result["stopped_enrollment_ids"])) == expected_stopped
    for enrollment in expected_stopped:
        assert status_of(pool, enrollment) == ("stopped", reason)
    if not erased:
        assert status_of(pool, setup.keeps) == ("active", None)
    assert status_of(pool, setup.completed) == ("completed", None)
    assert status_of(pool, setup.bystander) == ("active", None)
    assert stopped_total(reason) - stopped_before == len(expected_stopped)
    stop_events = {e["enrollment_id"]: e["reason"] for e in outbox(pool, "followup.stopped")}
    assert stop_events == {str(e): reason for e in expected_stopped}

    # ... and the QUEUED messages of those (and of the completed one) are CANCELLED with message.failed;
    # an erasure or an opt-out cancels every queued follow-up: nothing is ever sent to an opted-out contact
    cancelled = {messages[setup.stops], messages[setup.paused], messages[setup.completed]}
    if erased or reason == "opted_out":
        cancelled.add(messages[setup.keeps])
    assert set(map(uuid.UUID, result["cancelled_message_ids"])) == cancelled
    failed = failed_events(pool)
    assert set(failed) == {str(m) for m in cancelled}
    assert all(e["reason"] == "CANCELLED" for e in failed.values())
    assert {e["stop_reason"] for e in failed.values()} == {reason}
    if erased:  # the messages themselves are gone
        assert rows(pool, "SELECT id FROM messages WHERE contact_id = %s", setup.contact) == []
    else:
        for message in cancelled:
            assert one(pool, "SELECT status FROM messages WHERE id = %s", message) == "CANCELLED"
            assert "CANCELLED" in [
                r[0]
                for r in rows(pool, "SELECT status FROM message_status_events WHERE message_id = %s", message)
            ]
        if reason != "opted_out":
            assert one(pool, "SELECT status FROM messages WHERE id = %s", messages[setup.keeps]) == "QUEUED"
    assert one(pool, "SELECT status FROM messages WHERE id = %s", bystander_message) == "QUEUED"

    # And a stopped follow-up is never released again
    runtime.clock.advance(timedelta(days=2))  # type: ignore[attr-defined]
    release(runtime)
    for enrollment in expected_stopped:
        assert status_of(pool, enrollment) == ("stopped", reason)


def test_a_message_the_send_lane_claimed_is_left_alone_by_a_reply(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence_with(pool, project.id), contact).id
    release(runtime)
    message, status = message_of(pool, enrollment)
    assert status == "QUEUED"
    # the send lane picks the message up
    claimed = client.post("/v1/send-lane/claim", json={"limit": 10})
    assert claimed.status_code == 200, claimed.text
    assert [item["id"] for item in claimed.json()["items"]] == [str(message)]
    before = stopped_total("replied")

    result = post_event(
        client, {"type": "message.inbound", "contact_id": str(contact), "provider_message_id": "p1"}, 201
    )

    assert result["stopped_enrollment_ids"] == [str(enrollment)]
    assert result["cancelled_message_ids"] == []
    assert status_of(pool, enrollment) == ("stopped", "replied")
    assert message_of(pool, enrollment) == (message, "PROCESSING")
    assert outbox(pool, "message.failed") == []
    assert stopped_total("replied") - before == 1


def test_a_repeated_inbound_message_is_applied_once(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence_with(pool, project.id), contact).id
    release(runtime)
    before = stopped_total("replied")
    event = {
        "type": "message.inbound",
        "contact_id": str(contact),
        "provider_message_id": "wamid.1",
        "body": "yes",
    }

    first = post_event(client, event, 201)
    again = post_event(client, event, 200)

    assert first["applied"] is True and first["stopped_enrollment_ids"] == [str(enrollment)]
    assert again["applied"] is False
    assert again["message_id"] == first["message_id"]
    assert again["conversation_id"] == first["conversation_id"]
    assert again["stopped_enrollment_ids"] == [] and again["cancelled_message_ids"] == []
    assert stopped_total("replied") - before == 1
    assert one(pool, "SELECT count(*) FROM messages WHERE provider_message_id = 'wamid.1'") == 1
    assert len(outbox(pool, "message.received")) == 1
    assert len(outbox(pool, "followup.stopped")) == 1
    assert len(outbox(pool, "message.failed")) == 1


def test_an_inbound_message_by_phone_creates_the_contact_and_its_conversation(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    phone = new_phone()
    result = post_event(
        client, {"type": "message.inbound", "phone": phone, "provider_message_id": "x1", "body": "hello"}, 201
    )
    contact = client.get(f"/v1/contacts/{result['contact_id']}").json()
    assert contact["phone"] == phone
    conversation = client.get(f"/v1/conversations/{result['conversation_id']}").json()
    assert conversation["contact_id"] == result["contact_id"]
    assert conversation["last_incoming_message_id"] == result["message_id"]
    # the next message from the same phone lands in the same contact and open conversation
    again = post_event(client, {"type": "message.inbound", "phone": phone, "provider_message_id": "x2"}, 201)
    assert (again["contact_id"], again["conversation_id"]) == (
        result["contact_id"],
        result["conversation_id"],
    )


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


# --- contacts, leads, deals ------------------------------------------------------------------------------


def test_opt_out_and_opt_in(client: TestClient[Any], runtime: Runtime, project: Project) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence_with(pool, project.id), contact).id
    before = stopped_total("opted_out")

    first = post_event(client, {"type": "contact.opted_out", "contact_id": str(contact)}, 200)
    again = post_event(client, {"type": "contact.opted_out", "contact_id": str(contact)}, 200)

    assert first["applied"] is True and first["stopped_enrollment_ids"] == [str(enrollment)]
    assert again["applied"] is False and again["stopped_enrollment_ids"] == []
    assert stopped_total("opted_out") - before == 1
    body = client.get(f"/v1/contacts/{contact}").json()
    assert body["opted_out_at"] is not None and body["consent"] == "revoked"
    # an opted-out contact cannot be enrolled
    response = client.post(
        "/v1/enrollments", json={"contact_id": str(contact), "steps": [{"kind": "message", "text": "x"}]}
    )
    assert response.status_code == 409

    opted_in = post_event(client, {"type": "contact.opted_in", "contact_id": str(contact)}, 200)
    assert opted_in["applied"] is True
    assert (
        post_event(client, {"type": "contact.opted_in", "contact_id": str(contact)}, 200)["applied"] is False
    )
    body = client.get(f"/v1/contacts/{contact}").json()
    assert body["opted_out_at"] is None and body["consent"] == "granted"
    assert status_of(pool, enrollment) == ("stopped", "opted_out")  # opting in does not resume anything


def test_leads_and_deals(client: TestClient[Any], runtime: Runtime, project: Project) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence_with(pool, project.id), contact).id
    lead_id = str(uuid.uuid4())

    created = post_event(
        client, {"type": "lead.created", "contact_id": str(contact), "lead_id": lead_id}, 201
    )
    repeated = post_event(
        client, {"type": "lead.created", "contact_id": str(contact), "lead_id": lead_id}, 200
    )
    assert created["applied"] is True and repeated["applied"] is False
    someone_else = str(make_contact(pool, project.id))
    taken = client.post(
        "/v1/events", json={"type": "lead.created", "contact_id": someone_else, "lead_id": lead_id}
    )
    assert taken.status_code == 409 and taken.json()["errors"][0]["field"] == "lead_id"
    changed = post_event(
        client, {"type": "lead.status_changed", "lead_id": lead_id, "status": "qualified"}, 200
    )
    assert changed["stopped_enrollment_ids"] == [] and changed["contact_id"] == str(contact)
    assert status_of(pool, enrollment) == ("active", None)
    assert one(pool, "SELECT status, closed_at FROM leads WHERE id = %s", lead_id) == ("qualified", None)

    closed = post_event(client, {"type": "lead.closed", "lead_id": lead_id, "status": "lost"}, 200)
    assert closed["stopped_enrollment_ids"] == [str(enrollment)]
    assert status_of(pool, enrollment) == ("stopped", "lead_closed")
    status, closed_at = one(pool, "SELECT status, closed_at FROM leads WHERE id = %s", lead_id)
    assert status == "lost" and closed_at == runtime.clock.now()
    runtime.clock.advance(timedelta(hours=1))  # type: ignore[attr-defined]
    post_event(client, {"type": "lead.closed", "lead_id": lead_id, "status": "lost"}, 200)
    assert one(pool, "SELECT closed_at FROM leads WHERE id = %s", lead_id) == closed_at  # a repeat keeps it

    deal_id = str(uuid.uuid4())
    deal = post_event(
        client,
        {
            "type": "deal.stage_changed",
            "deal_id": deal_id,
            "stage": "proposal",
            "contact_id": str(contact),
            "lead_id": lead_id,
        },
        200,
    )
    assert (deal["contact_id"], deal["status"]) == (str(contact), "proposal")
    post_event(client, {"type": "deal.stage_changed", "deal_id": deal_id, "stage": "won"}, 200)
    assert one(pool, "SELECT stage, contact_id, lead_id FROM deals WHERE id = %s", deal_id) == (
        "won",
        contact,
        uuid.UUID(lead_id),
    )
    missing = client.post(
        "/v1/events", json={"type": "deal.stage_changed", "deal_id": str(uuid.uuid4()), "stage": "x"}
    )
    assert missing.status_code == 404
    unknown_lead = client.post("/v1/events", json={"type": "lead.closed", "lead_id": str(uuid.uuid4())})
    assert unknown_lead.status_code == 404 and unknown_lead.json()["errors"][0]["field"] == "lead_id"


def test_ids_are_the_projects_own_another_projects_are_neither_seen_nor_taken(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    # Given another project's contact, lead, deal and conversation
    pool = runtime.pool
    theirs = make_contact(pool, other_project.id)
    lead = post_event(client, {"type": "lead.created", "contact_id": str(theirs)}, None)
    assert lead["status"] == 404
    their_lead = client.post(
        "/v1/events", json={"type": "lead.created", "contact_id": str(theirs)}, headers=other_project.headers
    ).json()["lead_id"]
    deal = str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    for event in (
        {"type": "deal.stage_changed", "deal_id": deal, "stage": "a", "contact_id": str(theirs)},
        {"type": "conversation.created", "conversation_id": conversation, "contact_id": str(theirs)},
    ):
        response = client.post("/v1/events", json=event, headers=other_project.headers)
        assert response.status_code in (200, 201), response.text
    mine = make_contact(pool, project.id)
    # When this project changes them by id without a contact of its own: they are not found
    for event in (
        {"type": "lead.closed", "lead_id": their_lead},
        {"type": "lead.status_changed", "lead_id": their_lead, "status": "x"},
        {"type": "deal.stage_changed", "deal_id": deal, "stage": "b"},
        {"type": "conversation.resolved", "conversation_id": conversation},
    ):
        response = client.post("/v1/events", json=event)
        assert response.status_code == 404, (event, response.text)
    # And when it creates its own under the same ids, they are created: an id tells nothing of another
    # project's, and no project can take one that another will need
    for event in (
        {"type": "lead.created", "contact_id": str(mine), "lead_id": their_lead},
        {"type": "deal.stage_changed", "deal_id": deal, "stage": "b", "contact_id": str(mine)},
        {"type": "conversation.created", "conversation_id": conversation, "contact_id": str(mine)},
    ):
        response = client.post("/v1/events", json=event)
        assert response.status_code in (200, 201), (event, response.text)
    # Then each project holds its own row under the id, and the other project's rows are unchanged
    for table, row_id in (("leads", their_lead), ("deals", deal), ("conversations", conversation)):
        holders = rows(pool, f"SELECT project_id, contact_id FROM {table} WHERE id = %s ORDER BY 1", row_id)
        assert sorted(holders) == sorted([(other_project.id, theirs), (project.id, mine)]), table
    for sql, row_id, expected in (
        ("SELECT stage FROM deals WHERE project_id = %s AND id = %s", deal, "a"),
        ("SELECT status FROM leads WHERE project_id = %s AND id = %s", their_lead, "open"),
        ("SELECT status FROM conversations WHERE project_id = %s AND id = %s", conversation, "open"),
    ):
        assert one(pool, sql, other_project.id, row_id) == expected
    # And a deal of this project may not point at the other project's lead unless it has its own
    response = client.post(
        "/v1/events",
        json={
            "type": "deal.stage_changed",
            "deal_id": str(uuid.uuid4()),
            "stage": "b",
            "contact_id": str(mine),
            "lead_id": str(uuid.uuid4()),
        },
    )
    assert response.status_code == 404, response.text


# --- conversations ---------------------------------------------------------------------------------------


def test_conversation_lifecycle(client: TestClient[Any], runtime: Runtime, project: Project) -> None:
    pool, clock = runtime.pool, runtime.clock
    contact = str(make_contact(pool, project.id))
    conversation_id = str(uuid.uuid4())
    created = post_event(
        client,
        {"type": "conversation.created", "contact_id": contact, "conversation_id": conversation_id},
        201,
    )
    assert (created["conversation_id"], created["status"]) == (conversation_id, "open")
    again = post_event(
        client,
        {"type": "conversation.created", "contact_id": contact, "conversation_id": conversation_id},
        200,
    )
    assert again["applied"] is False and again["conversation_id"] == conversation_id
    t0 = clock.now()

    def read() -> dict[str, Any]:
        body: dict[str, Any] = client.get(f"/v1/conversations/{conversation_id}").json()
        return body

    assert read()["status_changed_at"] == t0.isoformat().replace("+00:00", "Z")
    assert read()["waiting_since"] is None

    def iso(moment: Any) -> str:
        return str(moment.isoformat().replace("+00:00", "Z"))

    # a contact's message starts the wait; a second one does not move it
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    t1 = clock.now()
    post_event(
        client,
        {
            "type": "message.inbound",
            "contact_id": contact,
            "conversation_id": conversation_id,
            "provider_message_id": "a",
        },
        201,
    )
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    post_event(client, {"type": "message.inbound", "contact_id": contact, "provider_message_id": "b"}, 201)
    assert read()["waiting_since"] == iso(t1)
    assert read()["status_changed_at"] == iso(t0)  # messages do not change the status
    # an agent's answer ends it
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    post_event(client, {"type": "message.human", "conversation_id": conversation_id, "body": "hello"}, 201)
    assert read()["waiting_since"] is None
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    t4 = clock.now()
    post_event(client, {"type": "message.inbound", "contact_id": contact, "provider_message_id": "c"}, 201)
    assert read()["waiting_since"] == iso(t4)

    # status_changed_at moves on a real change only
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    t5 = clock.now()
    changed = post_event(
        client,
        {"type": "conversation.status_changed", "conversation_id": conversation_id, "status": "pending"},
        200,
    )
    assert changed["status"] == "pending"
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    post_event(
        client,
        {"type": "conversation.status_changed", "conversation_id": conversation_id, "status": "pending"},
        200,
    )
    assert (read()["status"], read()["status_changed_at"]) == ("pending", iso(t5))
    assert read()["waiting_since"] == iso(t4)  # a status change that is not resolving keeps the wait
    # resolving ends the wait
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    t7 = clock.now()
    post_event(client, {"type": "conversation.resolved", "conversation_id": conversation_id}, 200)
    assert (read()["status"], read()["status_changed_at"], read()["waiting_since"]) == (
        "resolved",
        iso(t7),
        None,
    )
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    post_event(client, {"type": "conversation.resolved", "conversation_id": conversation_id}, 200)
    assert read()["status_changed_at"] == iso(t7)
    clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    t9 = clock.now()
    opened = post_event(client, {"type": "conversation.opened", "conversation_id": conversation_id}, 200)
    assert opened["status"] == "open"
    assert (read()["status"], read()["status_changed_at"]) == ("open", iso(t9))


def test_a_conversation_resolved_or_human_message_spares_follow_ups_of_another_conversation(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    first = post_event(client, {"type": "conversation.created", "contact_id": str(contact)}, 201)[
        "conversation_id"
    ]
    second = post_event(client, {"type": "conversation.created", "contact_id": str(contact)}, 201)[
        "conversation_id"
    ]
    in_first = client.post(
        f"/v1/conversations/{first}/follow-up", json={"text": "one", "delay_seconds": DAY}
    ).json()
    in_second = client.post(
        f"/v1/conversations/{second}/follow-up", json={"text": "two", "delay_seconds": DAY}
    ).json()

    human = post_event(client, {"type": "message.human", "conversation_id": first}, 201)
    assert human["stopped_enrollment_ids"] == [in_first["id"]]
    resolved = post_event(client, {"type": "conversation.resolved", "conversation_id": second}, 200)
    assert resolved["stopped_enrollment_ids"] == [in_second["id"]]
    assert status_of(pool, uuid.UUID(in_first["id"])) == ("stopped", "human_message")
    assert status_of(pool, uuid.UUID(in_second["id"])) == ("stopped", "conversation_resolved")


# --- contact.erased --------------------------------------------------------------------------------------


def test_an_erased_contact_leaves_nothing_that_identifies_the_person(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    pool = runtime.pool
    phone = new_phone()
    contact = make_contact(
        pool,
        project.id,
        phone=phone,
        name="Grace Hopper",
        timezone="Europe/Paris",
        attributes={"email": "grace@example.com"},
        tags=["vip"],
    )
    other = make_contact(pool, project.id, name="Someone else")
    sequence = sequence_with(pool, project.id, reply=False, opt_out=False)
    enrollment = make_enrollment(
        pool,
        runtime.clock,
        project.id,
        sequence,
        contact,
        variables={"first_name": "Grace"},
        dedupe_key=f"grace-{phone}",
    ).id
    kept = make_enrollment(pool, runtime.clock, project.id, sequence, other, variables={"x": 1}).id
    release(runtime)
    conversation = post_event(
        client,
        {
            "type": "message.inbound",
            "contact_id": str(contact),
            "provider_message_id": "g1",
            "body": "my address is ...",
        },
        201,
    )["conversation_id"]
    post_event(client, {"type": "lead.created", "contact_id": str(contact)}, 201)
    # the reply's time is on the contact (the release path reads it there) until the erasure
    assert one(pool, "SELECT last_inbound_at FROM contacts WHERE id = %s", contact) == runtime.clock.now()
    before = stopped_total("contact_erased")

    result = post_event(client, {"type": "contact.erased", "contact_id": str(contact)}, 200)

    assert result["stopped_enrollment_ids"] == [str(enrollment)]
    assert stopped_total("contact_erased") - before == 1
    row = one(
        pool,
        "SELECT phone, name, timezone, attributes, tags, last_inbound_at, erased_at FROM contacts"
        " WHERE id = %s",
        contact,
    )
    assert row[:6] == (None, None, None, {}, [], None) and row[6] is not None
    assert rows(pool, "SELECT id FROM messages WHERE contact_id = %s", contact) == []
    assert rows(pool, "SELECT id FROM activities WHERE contact_id = %s", contact) == []
    assert one(
        pool,
        "SELECT last_incoming_message_id, last_outgoing_message_id, waiting_since FROM conversations"
        " WHERE id = %s",
        conversation,
    ) == (None, None, None)
    assert one(
        pool,
        "SELECT status, reason, variables, dedupe_key FROM followup_enrollments WHERE id = %s",
        enrollment,
    ) == ("stopped", "contact_erased", {}, None)
    # nothing of the person anywhere: no table holds the phone, name, e-mail or message text any more
    with pool.connection() as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                " AND table_type = 'BASE TABLE'"
            ).fetchall()
        ]
        for table in tables:
            dump = conn.execute(
                f"SELECT coalesce(string_agg(t::text, '\n'), '') FROM \"{table}\" t"
            ).fetchone()
            assert dump is not None
            for secret in (phone, "Grace", "grace@example.com", "my address"):
                assert secret not in dump[0], (table, secret)
    # the other contact is untouched
    assert one(pool, "SELECT name FROM contacts WHERE id = %s", other) == "Someone else"
    assert one(pool, "SELECT status, variables FROM followup_enrollments WHERE id = %s", kept) == (
        "active",
        {"x": 1},
    )
    # the API shows nothing of the person either
    response = client.get(f"/v1/contacts/{contact}")
    if response.status_code == 200:
        body = response.json()
        assert (body["phone"], body["name"], body["attributes"], body["tags"]) == (None, None, {}, [])
    else:
        assert response.status_code == 404
    listed = client.get("/v1/contacts").json()["items"]
    assert all(c["phone"] != phone for c in listed)
    # and an erased contact takes no more events
    for event in (
        {"type": "message.inbound", "contact_id": str(contact), "provider_message_id": "g2"},
        {"type": "contact.opted_in", "contact_id": str(contact)},
        {"type": "contact.erased", "contact_id": str(contact)},
        {"type": "conversation.created", "contact_id": str(contact)},
        {"type": "message.human", "conversation_id": conversation, "body": "Dear Grace"},
    ):
        assert client.post("/v1/events", json=event).status_code == 404, event
    assert rows(pool, "SELECT id FROM messages WHERE contact_id = %s", contact) == []
    assert len(outbox(pool, "contact.erased")) == 1


# --- the conversation follow-up shortcut -----------------------------------------------------------------


def test_a_conversation_follow_up_is_sent_after_its_delay_when_nobody_replied(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    pool, clock = runtime.pool, runtime.clock
    contact = make_contact(pool, project.id)
    conversation = post_event(client, {"type": "conversation.created", "contact_id": str(contact)}, 201)
    # a newer open conversation: the follow-up must still thread into the one it was made for
    post_event(client, {"type": "conversation.created", "contact_id": str(contact)}, 201)
    response = client.post(
        f"/v1/conversations/{conversation['conversation_id']}/follow-up",
        json={"text": "Any news?", "delay_seconds": DAY},
    )
    assert response.status_code == 201, response.text
    enrollment = response.json()
    assert enrollment["conversation_id"] == conversation["conversation_id"]
    assert enrollment["contact_id"] == str(contact)

    release(runtime)
    clock.advance(timedelta(seconds=DAY - 1))  # type: ignore[attr-defined]
    assert release(runtime) == 0
    assert rows(pool, "SELECT id FROM messages") == []
    clock.advance(timedelta(seconds=1))  # type: ignore[attr-defined]
    assert release(runtime) == 1

    body, status, conversation_id = one(pool, "SELECT body, status, conversation_id FROM messages")
    assert (body, status, str(conversation_id)) == ("Any news?", "QUEUED", conversation["conversation_id"])
    assert status_of(pool, uuid.UUID(enrollment["id"])) == ("completed", None)


def test_a_conversation_follow_up_is_not_sent_after_a_reply(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    pool, clock = runtime.pool, runtime.clock
    contact = make_contact(pool, project.id)
    conversation = post_event(client, {"type": "conversation.created", "contact_id": str(contact)}, 201)[
        "conversation_id"
    ]
    enrollment = client.post(f"/v1/conversations/{conversation}/follow-up", json={"text": "Any news?"}).json()
    before = stopped_total("replied")

    clock.advance(timedelta(hours=3))  # type: ignore[attr-defined]
    post_event(
        client, {"type": "message.inbound", "contact_id": str(contact), "provider_message_id": "r"}, 201
    )
    clock.advance(timedelta(days=1))  # type: ignore[attr-defined]
    release(runtime)

    assert status_of(pool, uuid.UUID(enrollment["id"])) == ("stopped", "replied")
    assert stopped_total("replied") - before == 1
    assert rows(pool, "SELECT id FROM messages WHERE direction = 'outbound'") == []


def test_a_conversation_follow_up_needs_a_conversation_of_the_project(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    pool = runtime.pool
    theirs = client.post(
        "/v1/events",
        json={"type": "conversation.created", "contact_id": str(make_contact(pool, other_project.id))},
        headers=other_project.headers,
    ).json()["conversation_id"]
    for conversation in (str(uuid.uuid4()), theirs):
        response = client.post(f"/v1/conversations/{conversation}/follow-up", json={"text": "hi"})
        assert response.status_code == 404, response.text
        assert response.json()["errors"][0]["field"] == "conversation_id"
        assert client.get(f"/v1/conversations/{conversation}").status_code == 404
    mine = post_event(
        client, {"type": "conversation.created", "contact_id": str(make_contact(pool, project.id))}, 201
    )
    for body, field in (
        ({"text": "hi", "delay_seconds": -1}, "delay_seconds"),
        ({"text": " "}, "text"),
        ({"text": "Hi {{ vars.name"}, "text"),
        ({"text": "Hi", "media_kind": "image"}, "media_url"),
        ({"text": "Hi", "media_url": "ftp://x/y.png", "media_kind": "image"}, "media_url"),
        ({"delay_seconds": 5}, "text"),
    ):
        response = client.post(f"/v1/conversations/{mine['conversation_id']}/follow-up", json=body)
        assert response.status_code in (400, 422), response.text
        assert field in [e["field"] for e in response.json()["errors"]], response.text
    assert rows(pool, "SELECT id FROM followup_enrollments") == []


# --- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "status", "field"),
    [
        ({"type": "message.sms", "contact_id": "x"}, 422, "type"),
        ({"contact_id": str(uuid.uuid4())}, 400, "type"),
        ({"type": "contact.opted_out"}, 400, "contact_id"),
        ({"type": "contact.opted_out", "contact_id": "not-a-uuid"}, 400, "contact_id"),
        ({"type": "message.inbound", "contact_id": str(uuid.uuid4())}, 400, "provider_message_id"),
        ({"type": "message.status", "status": "BOUNCED", "message_id": str(uuid.uuid4())}, 422, "status"),
        ({"type": "contact.opted_out", "contact_id": str(uuid.uuid4()), "extra": 1}, 400, "extra"),
        ({"type": "message.inbound", "provider_message_id": "p"}, 422, "contact_id"),
        (
            {"type": "message.inbound", "provider_message_id": "", "phone": "+15550000001"},
            422,
            "provider_message_id",
        ),
        ({"type": "message.inbound", "provider_message_id": "p", "phone": "12"}, 422, "phone"),
    ],
)
def test_a_malformed_event_is_refused_naming_the_field(
    client: TestClient[Any], pool: ConnectionPool, event: dict[str, Any], status: int, field: str
) -> None:
    response = client.post("/v1/events", json=event)
    assert response.status_code == status, response.text
    assert field in [e["field"] for e in response.json()["errors"]], response.text
    assert rows(pool, "SELECT id FROM messages") == []
    assert rows(pool, "SELECT id FROM contacts") == []


def test_unknown_or_foreign_ids_are_404_and_nothing_is_half_written(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    pool = runtime.pool
    theirs = make_contact(pool, other_project.id)
    their_conversation = client.post(
        "/v1/events",
        json={"type": "conversation.created", "contact_id": str(theirs)},
        headers=other_project.headers,
    ).json()["conversation_id"]
    mine = make_contact(pool, project.id)
    sequence = sequence_with(pool, project.id)
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence, mine).id
    release(runtime)
    outbox_before = one(pool, "SELECT count(*) FROM outbox")
    phone = new_phone()
    cases = [
        (
            {"type": "message.inbound", "contact_id": str(uuid.uuid4()), "provider_message_id": "a"},
            "contact_id",
        ),
        ({"type": "message.inbound", "contact_id": str(theirs), "provider_message_id": "b"}, "contact_id"),
        # an unknown conversation: the message is not written, but the reply of a known contact still
        # stops its follow-ups (replies fail closed; see tests/test_replies_fail_closed.py)
        (
            {
                "type": "message.inbound",
                "contact_id": str(mine),
                "conversation_id": str(uuid.uuid4()),
                "provider_message_id": "c",
            },
            "conversation_id",
        ),
        (
            {
                "type": "message.inbound",
                "contact_id": str(mine),
                "conversation_id": their_conversation,
                "provider_message_id": "d",
            },
            "conversation_id",
        ),
        # by phone: the contact it would have created is rolled back too
        (
            {
                "type": "message.inbound",
                "phone": phone,
                "conversation_id": str(uuid.uuid4()),
                "provider_message_id": "e",
            },
            "conversation_id",
        ),
        ({"type": "message.human", "conversation_id": their_conversation}, "conversation_id"),
        ({"type": "contact.opted_out", "contact_id": str(theirs)}, "contact_id"),
        ({"type": "contact.opted_in", "contact_id": str(uuid.uuid4())}, "contact_id"),
        ({"type": "contact.erased", "contact_id": str(theirs)}, "contact_id"),
        ({"type": "lead.created", "contact_id": str(theirs)}, "contact_id"),
        ({"type": "conversation.created", "contact_id": str(theirs)}, "contact_id"),
        ({"type": "conversation.resolved", "conversation_id": their_conversation}, "conversation_id"),
        ({"type": "conversation.opened", "conversation_id": str(uuid.uuid4())}, "conversation_id"),
        (
            {
                "type": "conversation.status_changed",
                "conversation_id": their_conversation,
                "status": "pending",
            },
            "conversation_id",
        ),
    ]
    for event, field in cases:
        response = client.post("/v1/events", json=event)
        assert response.status_code == 404, (event, response.text)
        assert response.json()["errors"][0]["field"] == field, (event, response.text)
    assert status_of(pool, enrollment) == ("stopped", "replied")
    assert message_of(pool, enrollment)[1] == "CANCELLED"
    assert rows(pool, "SELECT id FROM messages WHERE direction = 'inbound'") == []
    assert rows(pool, "SELECT id FROM contacts WHERE phone = %s", phone) == []
    # the outbox holds only what the stop wrote
    assert rows(pool, "SELECT type FROM outbox ORDER BY id OFFSET %s", outbox_before) == [
        ("followup.stopped",),
        ("message.failed",),
    ]
    assert one(
        pool,
        "SELECT status, opted_out_at FROM contacts c JOIN conversations v ON v.contact_id = c.id"
        " WHERE c.id = %s",
        theirs,
    ) == ("open", None)


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
