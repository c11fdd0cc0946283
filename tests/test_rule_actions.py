"""What a rule's actions do, end to end through the API (rule created with ``POST /v1/rules``, event
caused through the API, the triggers service's work run, the effect read back): every action's effect and
refusals, the loop guard (rules never fire rules; follow-up steps and echoed changes fire nothing), and
nothing done to (or sent about) an erased contact.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from libs.common.rules.triggers import MAX_ATTEMPTS
from libs.common.rules.webhooks import deliver_due, verify_signature
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_sequence
from tests.helpers import rows
from tests.rule_helpers import add_label, add_tag, create_rule, leaf, post_event, process
from tests.rule_trigger_helpers import (
    add_tags,
    advance,
    contact_of,
    conversation_of,
    new_contact,
    new_conversation,
    notes,
    put_settings,
    rule_messages,
    runs,
    tags_of,
    trigger_count,
    unprocessed,
)


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


# --- 4. every action's effect ------------------------------------------------------------------------------


def test_enroll_in_sequence_enrolls_with_the_events_variables_and_anchor_once(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    sequence = make_sequence(runtime.pool, project.id)
    action = {
        "type": "enroll_in_sequence",
        "sequence_id": str(sequence),
        "anchor": "event_time",
        "variables": {"campaign": "spring"},
    }
    rule = create_rule(client, "contact.tag_added", [action])
    contact = new_contact(client)
    event_at = runtime.clock.now()

    add_tags(client, contact, "lead")
    advance(runtime, timedelta(minutes=5))  # processed later than the event happened
    assert process(runtime) == 1

    response = client.get("/v1/enrollments", params={"contact_id": contact})
    [enrollment] = response.json()["items"]
    assert (enrollment["sequence_id"], enrollment["source"], enrollment["status"]) == (
        str(sequence),
        "rule",
        "active",
    )
    assert enrollment["variables"] == {"event_type": "contact.tag_added", "tag": "lead", "campaign": "spring"}
    assert at(enrollment["anchor_at"]) == event_at
    assert runs(client, rule) == [("executed", None)]

    # a second trigger while the contact is enrolled: refused, an outcome
    add_tags(client, contact, "hot")
    assert process(runtime) == 1
    assert runs(client, rule) == [("executed", None), ("rejected", "already_enrolled")]
    assert len(client.get("/v1/enrollments", params={"contact_id": contact}).json()["items"]) == 1


def test_enroll_in_sequence_anchors_on_a_contact_attribute(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    sequence = make_sequence(runtime.pool, project.id)
    action = {
        "type": "enroll_in_sequence",
        "sequence_id": str(sequence),
        "anchor": "contact.attributes.visit",
    }
    rule = create_rule(client, "contact.created", [action])

    with_time = new_contact(client, attributes={"visit": "2030-02-01T10:00:00+01:00"})
    without = new_contact(client)
    assert process(runtime) == 2

    [enrollment] = client.get("/v1/enrollments", params={"contact_id": with_time}).json()["items"]
    assert at(enrollment["anchor_at"]) == at("2030-02-01T10:00:00+01:00")
    assert enrollment["variables"] == {"event_type": "contact.created"}
    assert client.get("/v1/enrollments", params={"contact_id": without}).json()["items"] == []
    assert sorted(runs(client, rule), key=str) == [("executed", None), ("rejected", "missing_anchor")]


def test_enroll_in_sequence_refusals_are_outcomes(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    sequence = make_sequence(runtime.pool, project.id)
    rule = create_rule(
        client, "contact.tag_added", [{"type": "enroll_in_sequence", "sequence_id": str(sequence)}]
    )
    opted_out = new_contact(client)
    post_event(client, {"type": "contact.opted_out", "contact_id": opted_out})
    add_tags(client, opted_out, "go")
    assert process(runtime) == 1
    assert client.post(f"/v1/sequences/{sequence}/archive").status_code == 200
    later = new_contact(client)
    add_tags(client, later, "go")
    assert process(runtime) == 1

    assert runs(client, rule) == [("rejected", "opted_out"), ("rejected", "sequence_not_enrollable")]
    assert unprocessed(runtime) == 0
    assert client.get("/v1/enrollments").json()["items"] == []


def test_send_message_queues_a_rule_message_in_the_events_conversation(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = create_rule(
        client,
        "message.created",
        [{"type": "send_message", "text": 'Hi {{ contact.name | "there" }}, we got it'}],
        leaf("message.type", "equal_to", "incoming"),
    )
    contact = new_contact(client, name="Ada")
    inbound = post_event(
        client,
        {"type": "message.inbound", "contact_id": contact, "provider_message_id": "in-1", "body": "hey"},
    )

    assert process(runtime) == 1

    [message] = rule_messages(runtime, contact)
    assert (message["direction"], message["status"], message["source"]) == ("outbound", "QUEUED", "rule")
    assert message["body"] == "Hi Ada, we got it"
    assert str(message["conversation_id"]) == inbound["conversation_id"]
    assert message["template_name"] is None
    assert runs(client, rule) == [("executed", None)]


def test_send_message_obeys_opt_out_consent_and_the_service_window(
    client: TestClient[Any], runtime: Runtime
) -> None:
    text_only = create_rule(client, "contact.tag_added", [{"type": "send_message", "text": "Hello"}])
    template = {"name": "welcome_back", "language": "pt_BR", "parameters": ['{{ contact.name | "friend" }}']}
    with_template = create_rule(
        client,
        "contact.tag_added",
        [{"type": "send_message", "text": "Hello", "whatsapp_template": template}],
    )

    # an opted-out contact
    opted_out = new_contact(client)
    post_event(client, {"type": "contact.opted_out", "contact_id": opted_out})
    add_tags(client, opted_out, "go")
    assert process(runtime) == 1
    assert runs(client, text_only) == [("rejected", "opted_out")]
    assert runs(client, with_template) == [("rejected", "opted_out")]

    # consent required, and the contact's is unknown
    put_settings(client, consent_mode="required")
    unknown = new_contact(client)
    assert contact_of(client, unknown)["consent"] == "unknown"
    add_tags(client, unknown, "go")
    assert process(runtime) == 1
    assert runs(client, text_only)[-1] == ("rejected", "no_consent")
    assert runs(client, with_template)[-1] == ("rejected", "no_consent")

    # the service window enforced: a contact who never wrote gets the template or nothing ... (both rules
    # write to one contact at once here, so the contact's spacing is off: it has a test of its own)
    put_settings(client, service_window="enforced", min_recipient_gap_seconds=0)
    silent = new_contact(client, name="Bo")
    add_tags(client, silent, "go")
    assert process(runtime) == 1
    assert runs(client, text_only)[-1] == ("rejected", "outside_service_window")
    assert runs(client, with_template)[-1] == ("executed", None)
    [message] = rule_messages(runtime, silent)
    assert (message["status"], message["body"]) == ("QUEUED", None)
    assert (message["template_name"], message["template_language"]) == ("welcome_back", "pt_BR")
    assert message["template_parameters"] == ["Bo"]

    # ... and one who wrote an hour ago gets the text
    writer = new_contact(client)
    post_event(
        client, {"type": "message.inbound", "contact_id": writer, "provider_message_id": "w-1", "body": "hi"}
    )
    advance(runtime, timedelta(hours=1))
    add_tags(client, writer, "go")
    assert process(runtime) == 1
    assert runs(client, text_only)[-1] == ("executed", None)
    assert runs(client, with_template)[-1] == ("executed", None)
    sent = rule_messages(runtime, writer)
    assert [(m["body"], m["template_name"]) for m in sent] == [("Hello", None), ("Hello", None)]
    for contact in (opted_out, unknown):
        assert rule_messages(runtime, contact) == []


def test_conversation_actions_change_the_conversation(client: TestClient[Any], runtime: Runtime) -> None:
    routed = create_rule(
        client,
        "conversation.created",
        [
            add_label("a", "b"),
            {"type": "remove_label", "labels": ["a"]},
            {"type": "assign_agent", "assignee": "alice"},
            {"type": "assign_team", "team": "support"},
            {"type": "change_priority", "priority": "high"},
            {"type": "add_private_note", "text": "Routed by a rule"},
        ],
        leaf("contact.tags", "contains", "route"),
    )
    pended = create_rule(
        client,
        "conversation.created",
        [{"type": "change_status", "status": "pending"}],
        leaf("contact.tags", "contains", "pend"),
    )
    snoozed = create_rule(
        client,
        "conversation.created",
        [{"type": "snooze_until", "minutes": 90}],
        leaf("contact.tags", "contains", "snooze"),
    )
    echo = create_rule(client, "conversation.updated", [add_tag("echo")])
    route, pend, snooze = (new_contact(client, tags=[tag]) for tag in ("route", "pend", "snooze"))
    conversations = {contact: new_conversation(client, contact) for contact in (route, pend, snooze)}
    advance(runtime, timedelta(minutes=10))
    processed_at = runtime.clock.now()

    assert process(runtime) == 3

    routed_conversation = conversation_of(client, conversations[route])
    assert routed_conversation["labels"] == ["b"]
    assert (
        routed_conversation["assignee"],
        routed_conversation["team"],
        routed_conversation["priority"],
    ) == (
        "alice",
        "support",
        "high",
    )
    assert routed_conversation["status"] == "open"
    [note] = notes(runtime, route)
    assert note == {
        "conversation_id": conversations[route],
        "text": "Routed by a rule",
        "executed_by": f"rule:{routed}",
    }
    assert conversation_of(client, conversations[pend])["status"] == "pending"
    snoozed_conversation = conversation_of(client, conversations[snooze])
    assert snoozed_conversation["status"] == "snoozed"
    assert at(snoozed_conversation["snoozed_until"]) == processed_at + timedelta(minutes=90)
    for rule in (routed, pended, snoozed):
        assert runs(client, rule) == [("executed", None)]
    # a rule's changes fire no rule event (conversation.updated has a rule listening)
    assert trigger_count(runtime) == 3
    assert runs(client, echo) == []


def test_conversation_actions_without_a_conversation_act_on_the_open_one_or_are_rejected(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = create_rule(
        client, "contact.tag_added", [add_label("tagged"), {"type": "assign_agent", "assignee": None}]
    )
    none = new_contact(client)
    resolved_only = new_contact(client)
    closed = new_conversation(client, resolved_only)
    post_event(client, {"type": "conversation.resolved", "conversation_id": closed})
    with_open = new_contact(client)
    open_one = new_conversation(client, with_open)
    post_event(client, {"type": "conversation.updated", "conversation_id": open_one, "assignee": "bo"})

    for contact in (none, resolved_only, with_open):
        add_tags(client, contact, "x")
        assert process(runtime) == 1

    assert runs(client, rule) == [
        ("rejected", "no_conversation"),
        ("rejected", "no_conversation"),
        ("executed", None),
    ]
    assert conversation_of(client, closed)["labels"] == []
    after = conversation_of(client, open_one)
    assert (after["labels"], after["assignee"]) == (["tagged"], None)
    [(count,)] = rows(runtime.pool, "SELECT count(*) FROM conversations WHERE contact_id = %s", none)
    assert count == 0


@dataclass
class Receiver:
    url: str
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A local HTTP server on 127.0.0.1 that records each POST and answers 200."""
    server = _Server(("127.0.0.1", 0), BaseHTTPRequestHandler)
    found = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hooks/rules")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            found.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_send_webhook_queues_a_signed_delivery(
    client: TestClient[Any], runtime: Runtime, project: Project, receiver: Receiver
) -> None:
    rule = create_rule(client, "lead.created", [{"type": "send_webhook", "url": receiver.url}])
    contact = new_contact(client)
    lead = post_event(client, {"type": "lead.created", "contact_id": contact, "status": "new"}, 201)

    assert process(runtime) == 1

    [delivery] = client.get("/v1/webhook-deliveries").json()["items"]
    assert (delivery["rule_id"], delivery["status"], delivery["url"]) == (rule, "pending", receiver.url)
    assert deliver_due(runtime.pool, runtime.clock) == 1

    [(headers, body)] = receiver.requests
    secret = client.get("/v1/webhook-deliveries/secret").json()["secret"]
    stamp, signature, delivered = (
        headers[f"x-followups-{h}"] for h in ("timestamp", "signature", "delivery")
    )
    assert verify_signature(secret, stamp, body, signature, delivery_id=delivered)
    assert not verify_signature(secret, stamp, body + b" ", signature, delivery_id=delivered)
    assert headers["x-followups-delivery"] == delivery["id"]
    payload = json.loads(body)
    assert (payload["event"], payload["rule_id"], payload["contact_id"]) == ("lead.created", rule, contact)
    assert (payload["project_id"], payload["conversation_id"]) == (str(project.id), None)
    assert payload["executed_by"] == f"rule:{rule}"
    assert (payload["data"]["lead_id"], payload["data"]["status"]) == (lead["lead_id"], "new")
    assert payload["trigger_id"] == delivery["trigger_id"]
    read = client.get(f"/v1/webhook-deliveries/{delivery['id']}").json()
    assert (read["status"], read["attempts"], read["last_status_code"]) == ("delivered", 1, 200)
    assert runs(client, rule) == [("executed", None)]


# --- 5. the loop guard -------------------------------------------------------------------------------------


def test_a_rule_on_conversation_updated_that_changes_the_conversation_fires_once_per_platform_change(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = create_rule(client, "conversation.updated", [add_label("triaged")])
    contact = new_contact(client)
    conversation = new_conversation(client, contact)

    post_event(client, {"type": "conversation.updated", "conversation_id": conversation, "assignee": "alice"})
    assert process(runtime) == 1
    assert (trigger_count(runtime), unprocessed(runtime)) == (1, 0)
    assert runs(client, rule) == [("executed", None)]
    assert conversation_of(client, conversation)["labels"] == ["triaged"]

    post_event(client, {"type": "conversation.updated", "conversation_id": conversation, "priority": "low"})
    assert process(runtime) == 1
    assert (trigger_count(runtime), unprocessed(runtime)) == (2, 0)
    assert runs(client, rule) == [("executed", None)] * 2
    assert conversation_of(client, conversation)["labels"] == ["triaged"]

    # the platform echoing an automation's change back records no trigger
    echoed = post_event(
        client,
        {
            "type": "conversation.updated",
            "conversation_id": conversation,
            "labels": ["echo", "triaged"],
            "private_note": "echoed",
            "executed_by": f"rule:{rule}",
        },
    )
    assert echoed["applied"] is True and echoed["trigger_ids"] == []
    assert trigger_count(runtime) == 2
    assert conversation_of(client, conversation)["labels"] == ["echo", "triaged"]
    assert notes(runtime, contact)[-1]["executed_by"] == f"rule:{rule}"


def test_tags_changed_by_a_rule_fire_no_tag_events(client: TestClient[Any], runtime: Runtime) -> None:
    tagger = create_rule(
        client, "contact.created", [add_tag("auto"), {"type": "remove_contact_tag", "tags": ["seed"]}]
    )
    on_added = create_rule(client, "contact.tag_added", [add_tag("never-added")])
    on_removed = create_rule(client, "contact.tag_removed", [add_tag("never-removed")])
    contact = new_contact(client, tags=["seed"])

    assert process(runtime) == 1

    assert tags_of(client, contact) == {"auto"}
    assert runs(client, tagger) == [("executed", None)]
    assert runs(client, on_added) == runs(client, on_removed) == []
    assert trigger_count(runtime, "contact.tag_added") == trigger_count(runtime, "contact.tag_removed") == 0


def test_messages_sent_by_a_rule_or_a_follow_up_step_fire_no_message_created(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    listener = create_rule(client, "message.created", [add_tag("heard")])
    sender = create_rule(client, "contact.tag_added", [{"type": "send_message", "text": "Hello from a rule"}])
    contact = new_contact(client)

    add_tags(client, contact, "greet")
    assert process(runtime) == 1
    assert len(rule_messages(runtime, contact)) == 1
    assert runs(client, sender) == [("executed", None)]

    sequence = make_sequence(runtime.pool, project.id)
    response = client.post("/v1/enrollments", json={"sequence_id": str(sequence), "contact_id": contact})
    assert response.status_code == 201, response.text
    advance(runtime, timedelta(seconds=6))  # the contact's spacing after the rule's message
    assert release_batch(runtime.pool, runtime.clock, runtime.settings.followup) == 1
    [(source, status)] = rows(
        runtime.pool,
        "SELECT source, status FROM messages WHERE followup_enrollment_id = %s",
        uuid.UUID(response.json()["id"]),
    )
    assert (source, status) == ("followup", "QUEUED")

    assert process(runtime) == 0
    assert trigger_count(runtime, "message.created") == 0
    assert runs(client, listener) == []
    assert tags_of(client, contact) == {"greet"}


# --- erasure -----------------------------------------------------------------------------------------------


def test_an_erasure_leaves_no_webhook_delivery_of_the_contact_to_send(
    client: TestClient[Any], runtime: Runtime, receiver: Receiver
) -> None:
    create_rule(client, "message.created", [{"type": "send_webhook", "url": receiver.url}])
    contact = new_contact(client)
    post_event(
        client,
        {"type": "message.inbound", "contact_id": contact, "provider_message_id": "s-1", "body": "my secret"},
    )
    assert process(runtime) == 1
    assert len(client.get("/v1/webhook-deliveries").json()["items"]) == 1

    post_event(client, {"type": "contact.erased", "contact_id": contact}, 200)

    # nothing that identifies the person is kept, or sent after the erasure
    assert deliver_due(runtime.pool, runtime.clock) == 0
    assert receiver.requests == []
    kept = rows(runtime.pool, "SELECT payload::text FROM webhook_deliveries")
    assert not any("my secret" in payload or contact in payload for (payload,) in kept)


def test_no_rule_acts_on_an_erased_contact(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    """An erased contact is gone for good (its triggers are deleted with it, an agent's message to it is
    refused): a later change to its conversation must not make rules write to it or fail on it."""
    sequence = make_sequence(runtime.pool, project.id)
    tagger = create_rule(client, "conversation.updated", [add_tag("touched")])
    enroller = create_rule(
        client, "conversation.updated", [{"type": "enroll_in_sequence", "sequence_id": str(sequence)}]
    )
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    post_event(client, {"type": "contact.erased", "contact_id": contact}, 200)

    # the platform still sends a change to the erased contact's conversation
    client.post("/v1/events", json={"type": "conversation.resolved", "conversation_id": conversation})
    client.post(
        "/v1/events", json={"type": "conversation.updated", "conversation_id": conversation, "assignee": "bo"}
    )
    for _ in range(MAX_ATTEMPTS):
        process(runtime)
        advance(runtime, timedelta(hours=1))

    # no rule acts (a refusal would do): nothing written to the erased contact, nothing retried or failed
    for rule in (tagger, enroller):
        assert all(outcome == "rejected" for outcome, _ in runs(client, rule)), runs(client, rule)
    [(tags, erased_at)] = rows(runtime.pool, "SELECT tags, erased_at FROM contacts WHERE id = %s", contact)
    assert erased_at is not None and tags == []
    failed = rows(runtime.pool, "SELECT type, last_error FROM followup_triggers WHERE attempts > 0")
    assert failed == []
