"""Platform events through ``POST /v1/events``: the stop paths they run (each stops the flagged
follow-ups and cancels their queued messages), inbound messages (applied once; by phone, the contact and its
conversation created), the conversation lifecycle, the conversation follow-up shortcut, and bad input
(refused naming the field; unknown or foreign ids 404 with nothing half written)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.runtime import Runtime
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, new_phone
from tests.helpers import rows
from tests.platform_event_helpers import (
    DAY,
    message_of,
    one,
    outbox,
    post_event,
    release,
    sequence_with,
    status_of,
    stopped_total,
)

#: Each stop path's copied flag (as in ``stop_on``) and the reason it records.
FLAG_OF = {
    "replied": "reply",
    "human_message": "human_message",
    "opted_out": "opt_out",
    "lead_closed": "lead_closed",
    "conversation_resolved": "conversation_resolved",
}


def failed_events(pool: ConnectionPool) -> dict[str, dict[str, Any]]:
    """``message.failed`` events by message id."""
    return {e["message_id"]: e for e in outbox(pool, "message.failed")}


class Setup:
    """One contact with follow-ups in every state a stop path cares about (messages QUEUED where sent)."""

    def __init__(self, client: TestClient[Any], runtime: Runtime, project: Project, flag: str) -> None:
        pool, clock = runtime.pool, runtime.clock
        # several follow-ups go to the contact at once here: its spacing is off (it has tests of its own)
        response = client.put("/v1/settings", json={"min_recipient_gap_seconds": 0})
        assert response.status_code == 200, response.text
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
