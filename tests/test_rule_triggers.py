"""Rules end to end through the API: a rule is created with ``POST /v1/rules``, its event is caused through
the API (contacts, tags, ``POST /v1/events``), the triggers service's work is run (``process_triggers`` until
it finds nothing due) and the effect is read back through the API (SQL where the API has no read).

Covered: every rule event fires (and only when an active rule listens), every condition operator in a rule
that fires and one that does not, every action's effect and refusals, the loop guard (rules never fire
rules; follow-up steps and echoed changes fire nothing), failures retried with backoff then given up,
the outcome counters, rules running in position order, erasure, a trigger taken over after its lease, and
projects kept apart.
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
from urllib.parse import quote

import psycopg
import pytest
from litestar.testing import TestClient
from prometheus_client import REGISTRY

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import StopFlags
from libs.common.rules.actions import AddLabel, AssignTeam
from libs.common.rules.triggers import BACKOFF_MIN, LEASE, MAX_ATTEMPTS, process_triggers
from libs.common.rules.webhooks import deliver_due, verify_signature
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_sequence, new_phone
from tests.helpers import rows, wait_until
from tests.rule_helpers import add_label, add_tag, create_rule, leaf, post_event, process

# --- helpers -----------------------------------------------------------------------------------------------


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
    """What the rule did, oldest first: (outcome, detail)."""
    response = client.get(f"/v1/rules/{rule_id}/runs")
    assert response.status_code == 200, response.text
    return [(run["outcome"], run["detail"]) for run in reversed(response.json()["items"])]


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


def put_settings(client: TestClient[Any], **settings: Any) -> None:
    response = client.put("/v1/settings", json=settings)
    assert response.status_code == 200, response.text


def advance(runtime: Runtime, delta: timedelta) -> datetime:
    clock = runtime.clock
    assert isinstance(clock, ManualClock)
    return clock.advance(delta)


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


# --- 1. every rule event fires -----------------------------------------------------------------------------


def test_contact_created_fires_on_create_on_an_upsert_that_creates_and_on_a_new_phones_message(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = create_rule(client, "contact.created", [add_tag("welcomed")])

    created = new_contact(client)
    phone = new_phone()
    response = client.put(f"/v1/contacts/by-phone/{quote(phone, safe='')}", json={"name": "Bo"})
    assert response.status_code == 201, response.text
    upserted = response.json()["id"]
    inbound = post_event(
        client, {"type": "message.inbound", "phone": new_phone(), "provider_message_id": "p-1", "body": "hi"}
    )
    assert len(inbound["trigger_ids"]) == 1
    # an upsert that updates an existing contact creates nothing
    response = client.put(f"/v1/contacts/by-phone/{quote(phone, safe='')}", json={"name": "Bob"})
    assert response.status_code == 200, response.text

    assert trigger_count(runtime, "contact.created") == 3
    assert process(runtime) == 3

    for contact_id in (created, upserted, inbound["contact_id"]):
        assert tags_of(client, contact_id) == {"welcomed"}
    assert runs(client, rule) == [("executed", None)] * 3
    assert unprocessed(runtime) == 0


def test_tag_added_and_tag_removed_fire_once_per_tag_that_changed(
    client: TestClient[Any], runtime: Runtime
) -> None:
    changed_tags = leaf("changed", "contains", "contact.tags")
    added = create_rule(
        client,
        "contact.tag_added",
        [add_tag("tagged")],
        {"all": [changed_tags, leaf("contact.tags", "contains", "vip")]},
    )
    removed = create_rule(
        client,
        "contact.tag_removed",
        [add_tag("untagged")],
        {"all": [changed_tags, leaf("contact.tags", "does_not_contain", "vip")]},
    )
    contact = new_contact(client, tags=["old"])

    add_tags(client, contact, "vip", "new", "old")  # "old" is no change

    assert trigger_count(runtime, "contact.tag_added") == 2
    found = rows(
        runtime.pool, "SELECT payload ->> 'tag' FROM followup_triggers WHERE contact_id = %s", contact
    )
    assert {row[0] for row in found} == {"vip", "new"}
    assert process(runtime) == 2
    assert tags_of(client, contact) == {"old", "vip", "new", "tagged"}
    assert runs(client, added) == [("executed", None)] * 2

    response = client.delete(f"/v1/contacts/{contact}/tags/vip")
    assert response.status_code == 200, response.text
    assert trigger_count(runtime, "contact.tag_removed") == 1
    assert process(runtime) == 1
    assert tags_of(client, contact) == {"old", "new", "tagged", "untagged"}
    assert runs(client, removed) == [("executed", None)]
    assert runs(client, added) == [("executed", None)] * 2


def test_contact_updated_fires_with_what_changed_from_and_to(
    client: TestClient[Any], runtime: Runtime
) -> None:
    upgraded = create_rule(
        client,
        "contact.updated",
        [add_tag("upgraded")],
        leaf("contact.attributes.plan", "attribute_changed", {"from": "silver", "to": "gold"}),
    )
    never = create_rule(
        client,
        "contact.updated",
        [add_tag("platinum")],
        leaf("contact.attributes.plan", "attribute_changed", {"to": "platinum"}),
    )
    renamed = create_rule(
        client,
        "contact.updated",
        [add_tag("renamed")],
        leaf("contact.name", "attribute_changed", {"from": "Ada"}),
    )
    contact = new_contact(client, name="Ada", attributes={"plan": "silver"})

    for change in ({"attributes": {"plan": "gold"}}, {"name": "Ada L."}, {"name": "Ada L."}):
        response = client.patch(f"/v1/contacts/{contact}", json=change)
        assert response.status_code == 200, response.text

    # the repeated rename changed nothing: two triggers, not three
    assert trigger_count(runtime, "contact.updated") == 2
    assert process(runtime) == 2
    assert tags_of(client, contact) == {"upgraded", "renamed"}
    assert runs(client, upgraded) == [("executed", None)]
    assert runs(client, renamed) == [("executed", None)]
    assert runs(client, never) == []

    # an upsert by phone that changes an attribute is an update too
    phone = quote(contact_of(client, contact)["phone"], safe="")
    response = client.put(f"/v1/contacts/by-phone/{phone}", json={"attributes": {"plan": "platinum"}})
    assert response.status_code == 200, response.text
    assert process(runtime) == 1
    assert runs(client, never) == [("executed", None)]
    assert "platinum" in tags_of(client, contact)


def test_lead_created_and_lead_status_changed_fire(client: TestClient[Any], runtime: Runtime) -> None:
    created = create_rule(
        client, "lead.created", [add_tag("lead-new")], leaf("lead.status", "equal_to", "new")
    )
    qualified = create_rule(
        client,
        "lead.status_changed",
        [add_tag("qualified")],
        leaf("lead.status", "attribute_changed", {"from": "new", "to": "qualified"}),
    )
    won = create_rule(
        client,
        "lead.status_changed",
        [add_tag("won")],
        {
            "all": [
                leaf("lead.status", "attribute_changed", {"to": "won"}),
                leaf("lead.status", "equal_to", "WON"),
            ]
        },
    )
    contact = new_contact(client)

    lead = post_event(client, {"type": "lead.created", "contact_id": contact, "status": "new"}, 201)
    assert process(runtime) == 1
    post_event(client, {"type": "lead.status_changed", "lead_id": lead["lead_id"], "status": "qualified"})
    assert process(runtime) == 1
    # closing the lead is a status change too
    post_event(client, {"type": "lead.closed", "lead_id": lead["lead_id"], "status": "won"})
    assert process(runtime) == 1
    # a repeat changes nothing and records nothing
    post_event(client, {"type": "lead.closed", "lead_id": lead["lead_id"], "status": "won"})
    assert trigger_count(runtime, "lead.status_changed") == 2

    assert tags_of(client, contact) == {"lead-new", "qualified", "won"}
    assert runs(client, created) == [("executed", None)]
    assert runs(client, qualified) == [("executed", None)]
    assert runs(client, won) == [("executed", None)]


def test_deal_stage_changed_fires_on_a_new_stage_only(client: TestClient[Any], runtime: Runtime) -> None:
    rule = create_rule(
        client, "deal.stage_changed", [add_tag("proposal")], leaf("deal.stage", "equal_to", "Proposal")
    )
    contact = new_contact(client)
    deal = str(uuid.uuid4())

    post_event(
        client, {"type": "deal.stage_changed", "deal_id": deal, "stage": "proposal", "contact_id": contact}
    )
    assert process(runtime) == 1
    assert tags_of(client, contact) == {"proposal"}
    assert runs(client, rule) == [("executed", None)]

    post_event(client, {"type": "deal.stage_changed", "deal_id": deal, "stage": "proposal"})
    assert trigger_count(runtime, "deal.stage_changed") == 1
    post_event(client, {"type": "deal.stage_changed", "deal_id": deal, "stage": "won"})
    assert process(runtime) == 1
    assert runs(client, rule) == [("executed", None)]  # the stage is won now: not matched


def test_conversation_events_fire_created_updated_opened_and_resolved(
    client: TestClient[Any], runtime: Runtime
) -> None:
    def note(name: str) -> list[dict[str, Any]]:
        return [{"type": "add_private_note", "text": f"{name} saw it"}]

    created = create_rule(client, "conversation.created", [add_label("new")])
    opened = create_rule(client, "conversation.opened", [add_label("reopened")])
    resolved = create_rule(client, "conversation.resolved", [add_label("was-resolved")])
    updated = {
        "labels": create_rule(
            client,
            "conversation.updated",
            note("labels"),
            {
                "all": [
                    leaf("changed", "contains", "conversation.labels"),
                    leaf("conversation.labels", "in", ["billing"]),
                ]
            },
        ),
        "assignee": create_rule(
            client,
            "conversation.updated",
            note("assignee"),
            leaf("conversation.assignee", "attribute_changed", {"to": "alice"}),
        ),
        "priority": create_rule(
            client,
            "conversation.updated",
            note("priority"),
            leaf("conversation.priority", "attribute_changed", {"from": None, "to": "high"}),
        ),
        "note": create_rule(
            client,
            "conversation.updated",
            note("note"),
            leaf("changed", "contains", "conversation.private_note"),
        ),
        "status": create_rule(
            client,
            "conversation.updated",
            note("status"),
            leaf("conversation.status", "attribute_changed", {"from": "open", "to": "pending"}),
        ),
    }
    contact = new_contact(client)

    conversation = new_conversation(client, contact)
    assert process(runtime) == 1
    assert conversation_of(client, conversation)["labels"] == ["new"]
    for change in ({"labels": ["new", "billing"]}, {"assignee": "alice"}, {"priority": "high"}):
        post_event(client, {"type": "conversation.updated", "conversation_id": conversation, **change})
        assert process(runtime) == 1
    post_event(
        client, {"type": "conversation.updated", "conversation_id": conversation, "private_note": "call back"}
    )
    assert process(runtime) == 1
    # a status change is a conversation.updated with the status that changed
    result = post_event(
        client, {"type": "conversation.status_changed", "conversation_id": conversation, "status": "pending"}
    )
    assert len(result["trigger_ids"]) == 1
    assert process(runtime) == 1
    # opened and resolved fire their own event and conversation.updated
    result = post_event(client, {"type": "conversation.opened", "conversation_id": conversation})
    assert len(result["trigger_ids"]) == 2
    assert process(runtime) == 2
    result = post_event(client, {"type": "conversation.resolved", "conversation_id": conversation})
    assert len(result["trigger_ids"]) == 2
    assert process(runtime) == 2
    # no change, no event
    repeated = post_event(
        client, {"type": "conversation.created", "contact_id": contact, "conversation_id": conversation}, 200
    )
    assert repeated["trigger_ids"] == []
    assert (
        post_event(client, {"type": "conversation.resolved", "conversation_id": conversation})["trigger_ids"]
        == []
    )
    assert (
        post_event(
            client, {"type": "conversation.updated", "conversation_id": conversation, "assignee": "alice"}
        )["trigger_ids"]
        == []
    )

    assert trigger_count(runtime, "conversation.updated") == 7
    for rule in (created, opened, resolved, *updated.values()):
        assert runs(client, rule) == [("executed", None)]
    after = conversation_of(client, conversation)
    assert after["labels"] == ["billing", "new", "reopened", "was-resolved"]
    assert (after["status"], after["assignee"], after["priority"]) == ("resolved", "alice", "high")
    texts = [n["text"] for n in notes(runtime, contact)]
    assert texts == [
        "labels saw it",
        "assignee saw it",
        "priority saw it",
        "call back",
        "note saw it",
        "status saw it",
    ]


def test_a_status_change_to_open_or_resolved_fires_conversation_opened_or_resolved(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # docs/api.md, Rules > Events: conversation.opened / conversation.resolved are recorded on "a status
    # change to open / resolved", whichever platform event made it
    opened = create_rule(client, "conversation.opened", [add_label("reopened")])
    resolved = create_rule(client, "conversation.resolved", [add_label("was-resolved")])
    contact = new_contact(client)
    conversation = new_conversation(client, contact)

    change = {"type": "conversation.status_changed", "conversation_id": conversation}
    post_event(client, change | {"status": "resolved"})
    assert process(runtime) == 1
    post_event(client, change | {"status": "open"})
    assert process(runtime) == 1

    assert runs(client, resolved) == [("executed", None)]
    assert runs(client, opened) == [("executed", None)]
    assert conversation_of(client, conversation)["labels"] == ["reopened", "was-resolved"]


def test_message_created_fires_for_incoming_and_outgoing_messages(
    client: TestClient[Any], runtime: Runtime
) -> None:
    stop = create_rule(
        client,
        "message.created",
        [add_tag("asked-to-stop")],
        {"all": [leaf("message.type", "equal_to", "incoming"), leaf("message.content", "contains", "STOP")]},
    )
    outgoing = create_rule(
        client, "message.created", [add_label("agent-replied")], leaf("message.type", "equal_to", "outgoing")
    )
    contact = new_contact(client)

    first = post_event(
        client,
        {"type": "message.inbound", "contact_id": contact, "provider_message_id": "in-1", "body": "hello"},
    )
    assert process(runtime) == 1
    assert tags_of(client, contact) == set()
    post_event(
        client,
        {
            "type": "message.inbound",
            "contact_id": contact,
            "provider_message_id": "in-2",
            "body": "please stop",
        },
    )
    assert process(runtime) == 1
    post_event(client, {"type": "message.human", "conversation_id": first["conversation_id"], "body": "Sure"})
    assert process(runtime) == 1

    assert tags_of(client, contact) == {"asked-to-stop"}
    assert conversation_of(client, first["conversation_id"])["labels"] == ["agent-replied"]
    assert runs(client, stop) == [("executed", None)]
    assert runs(client, outgoing) == [("executed", None)]
    [(content,)] = rows(
        runtime.pool,
        "SELECT payload #>> '{message,content}' FROM followup_triggers"
        " WHERE payload #>> '{message,type}' = 'outgoing'",
    )
    assert content == "Sure"


# --- 2. a trigger only when an active rule listens ---------------------------------------------------------


def test_no_trigger_is_recorded_for_an_event_no_active_rule_listens_to(
    client: TestClient[Any], runtime: Runtime
) -> None:
    lead_rule = create_rule(client, "lead.created", [add_tag("lead")])
    inactive = create_rule(client, "contact.created", [add_tag("never")], active=False)
    contact = new_contact(client, name="Ada")
    add_tags(client, contact, "vip")
    client.patch(f"/v1/contacts/{contact}", json={"name": "Ada L."})
    conversation = new_conversation(client, contact)
    post_event(client, {"type": "conversation.updated", "conversation_id": conversation, "assignee": "bo"})
    post_event(
        client, {"type": "message.inbound", "contact_id": contact, "provider_message_id": "m1", "body": "x"}
    )
    post_event(client, {"type": "message.human", "conversation_id": conversation, "body": "y"})
    post_event(client, {"type": "conversation.resolved", "conversation_id": conversation})
    assert trigger_count(runtime) == 0

    assert len(post_event(client, {"type": "lead.created", "contact_id": contact})["trigger_ids"]) == 1
    # disabled before the trigger is processed: it meets no rule
    assert client.post(f"/v1/rules/{lead_rule}/disable").status_code == 200
    no_rule = counted("lead.created", "no_rule")
    assert process(runtime) == 1
    assert counted("lead.created", "no_rule") - no_rule == 1
    assert runs(client, lead_rule) == []
    assert tags_of(client, contact) == {"vip"}
    [(outcome,)] = rows(runtime.pool, "SELECT outcome FROM followup_triggers")
    assert outcome == "processed"

    # disabled: no trigger any more; enabled again: triggers again
    assert post_event(client, {"type": "lead.created", "contact_id": contact})["trigger_ids"] == []
    assert trigger_count(runtime) == 1
    assert client.post(f"/v1/rules/{lead_rule}/enable").status_code == 200
    assert len(post_event(client, {"type": "lead.created", "contact_id": contact})["trigger_ids"]) == 1
    assert process(runtime) == 1
    assert runs(client, lead_rule) == [("executed", None)]
    assert runs(client, inactive) == []


# --- 3. every operator, in a rule that fires and one that does not -----------------------------------------

#: (name, conditions) of rules that must fire on the contact.updated below ...
FIRES: list[tuple[str, dict[str, Any]]] = [
    ("eq", leaf("contact.name", "equal_to", "ada LOVELACE")),
    ("eq-bool", leaf("contact.opted_out", "equal_to", False)),
    ("ne", leaf("contact.attributes.plan", "not_equal_to", "silver")),
    ("ne-absent", leaf("contact.timezone", "not_equal_to", "Europe/Paris")),  # holds for an absent value
    ("eq-list", leaf("contact.tags", "equal_to", "Beta")),  # a list equals a value it has
    ("contains-list", leaf("contact.tags", "contains", "VIP")),
    ("contains-text", leaf("contact.name", "contains", "love")),
    ("not-contains", leaf("contact.name", "does_not_contain", "grace")),
    ("starts", leaf("contact.phone", "starts_with", "+1555")),
    ("present", leaf("contact.attributes.plan", "is_present")),
    ("not-present", leaf("contact.timezone", "is_not_present")),
    ("gt", leaf("contact.attributes.score", "is_greater_than", 89.5)),
    ("lt", leaf("contact.attributes.score", "is_less_than", 100)),
    ("in", leaf("contact.attributes.plan", "in", ["platinum", "GOLD"])),
    ("in-number", leaf("contact.attributes.score", "in", [80, 90])),
    ("in-list", leaf("contact.tags", "in", ["x", "vip"])),
    ("not-in", leaf("contact.tags", "not_in", ["churned", "lost"])),
    ("changed", leaf("contact.attributes.score", "attribute_changed", {"from": 85, "to": 90})),
    ("changed-set", leaf("changed", "contains", "contact.attributes.score")),
    ("changed-present", leaf("changed", "is_present")),
    (
        "nested",
        {
            "all": [
                {
                    "any": [
                        leaf("contact.name", "equal_to", "Grace"),
                        leaf("contact.tags", "contains", "beta"),
                    ]
                },
                {
                    "any": [
                        {
                            "all": [
                                leaf("contact.attributes.score", "is_greater_than", 89),
                                leaf("contact.attributes.plan", "in", ["gold"]),
                            ]
                        },
                        leaf("contact.opted_out", "equal_to", True),
                    ]
                },
            ]
        },
    ),
]
#: ... and rules that must not.
MISSES: list[tuple[str, dict[str, Any]]] = [
    ("x-eq", leaf("contact.name", "equal_to", "Grace")),
    ("x-eq-bool", leaf("contact.opted_out", "equal_to", True)),
    ("x-ne", leaf("contact.attributes.plan", "not_equal_to", "gold")),
    ("x-contains-list", leaf("contact.tags", "contains", "churned")),
    ("x-contains-text", leaf("contact.name", "contains", "hopper")),
    ("x-not-contains", leaf("contact.tags", "does_not_contain", "vip")),
    ("x-starts", leaf("contact.phone", "starts_with", "+44")),
    ("x-present", leaf("contact.timezone", "is_present")),
    ("x-not-present", leaf("contact.name", "is_not_present")),
    ("x-gt", leaf("contact.attributes.score", "is_greater_than", 90)),
    ("x-lt", leaf("contact.attributes.score", "is_less_than", 90)),
    ("x-in", leaf("contact.attributes.plan", "in", ["silver"])),
    ("x-in-type", leaf("contact.attributes.score", "in", ["90"])),  # a number is not the text "90"
    ("x-not-in", leaf("contact.tags", "not_in", ["beta", "other"])),
    ("x-changed", leaf("contact.attributes.score", "attribute_changed", {"to": 100})),
    ("x-changed-other", leaf("contact.name", "attribute_changed", {"to": "Ada Lovelace"})),
    ("x-changed-set", leaf("changed", "does_not_contain", "contact.attributes.score")),
    ("x-changed-absent", leaf("changed", "is_not_present")),
    ("x-eq-list", leaf("contact.tags", "not_equal_to", "beta")),
    (
        "x-nested",
        {
            "any": [
                {
                    "all": [
                        leaf("contact.tags", "contains", "beta"),
                        leaf("contact.attributes.score", "is_less_than", 50),
                    ]
                },
                {"all": [leaf("contact.name", "equal_to", "Grace"), leaf("contact.tags", "contains", "vip")]},
                {"any": []},
            ]
        },
    ),
]


def test_every_operator_in_a_rule_that_fires_and_in_one_that_does_not(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule_ids = {
        name: create_rule(client, "contact.updated", [add_tag(name)], conditions)
        for name, conditions in FIRES + MISSES
    }
    contact = new_contact(
        client, name="Ada Lovelace", tags=["vip", "beta"], attributes={"plan": "gold", "score": 85}
    )
    not_matched = counted("contact.updated", "not_matched")

    response = client.patch(f"/v1/contacts/{contact}", json={"attributes": {"score": 90}})
    assert response.status_code == 200, response.text
    assert process(runtime) == 1

    fired = tags_of(client, contact) - {"vip", "beta"}
    assert fired == {name for name, _ in FIRES}
    for name, _ in FIRES:
        assert runs(client, rule_ids[name]) == [("executed", None)], name
    for name, _ in MISSES:
        assert runs(client, rule_ids[name]) == [], name
    assert counted("contact.updated", "not_matched") - not_matched == len(MISSES)


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

    # the service window enforced: a contact who never wrote gets the template or nothing ...
    put_settings(client, service_window="enforced")
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
    assert verify_signature(secret, headers["x-followups-timestamp"], body, headers["x-followups-signature"])
    assert not verify_signature(
        secret, headers["x-followups-timestamp"], body + b" ", headers["x-followups-signature"]
    )
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


# --- 6. failures -------------------------------------------------------------------------------------------


def trigger_row(runtime: Runtime, kind: str | None = None) -> dict[str, Any]:
    """The one trigger (of type ``kind``)."""
    with runtime.pool.connection() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        [row] = cur.execute(
            "SELECT attempts, next_attempt_at, processed_at, outcome, last_error FROM followup_triggers"
            " WHERE %s::text IS NULL OR type = %s",
            (kind, kind),
        ).fetchall()
    return row


def test_a_busy_conversation_retries_the_trigger_after_backoff_without_running_a_rule_twice(
    client: TestClient[Any], runtime: Runtime
) -> None:
    seen = create_rule(client, "lead.created", [add_tag("seen")])
    # the tag is added before the message fails: rolled back with the rule
    sender = create_rule(
        client, "lead.created", [add_tag("replied"), {"type": "send_message", "text": "We got your request"}]
    )
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    executed, retry = counted("lead.created", "executed"), counted("lead.created", "retry")

    with psycopg.connect(runtime.settings.database.url) as locker:
        # another transaction holds the contact's open conversation: queueing the message raises busy
        locker.execute("SELECT id FROM conversations WHERE id = %s FOR UPDATE", (conversation,))
        post_event(client, {"type": "lead.created", "contact_id": contact}, 201)
        first = runtime.clock.now()
        assert process(runtime) == 1
        row = trigger_row(runtime)
        assert (row["attempts"], row["processed_at"], row["outcome"]) == (1, None, None)
        assert row["next_attempt_at"] == first + BACKOFF_MIN
        assert "ConversationBusy" in row["last_error"] and sender in row["last_error"]
        assert runs(client, seen) == [("executed", None)]
        assert runs(client, sender) == []
        assert tags_of(client, contact) == {"seen"}

        advance(runtime, BACKOFF_MIN - timedelta(seconds=1))
        assert process(runtime) == 0  # not due yet
        advance(runtime, timedelta(seconds=1))
        assert process(runtime) == 1
        row = trigger_row(runtime)
        assert row["attempts"] == 2
        assert row["next_attempt_at"] == runtime.clock.now() + 2 * BACKOFF_MIN
        locker.rollback()

    advance(runtime, 2 * BACKOFF_MIN)
    assert process(runtime) == 1

    row = trigger_row(runtime)
    assert (row["attempts"], row["outcome"], row["last_error"]) == (2, "processed", None)
    assert row["processed_at"] == runtime.clock.now()
    assert runs(client, seen) == [("executed", None)]  # not run again on the retries
    assert runs(client, sender) == [("executed", None)]
    assert tags_of(client, contact) == {"seen", "replied"}
    [message] = rule_messages(runtime, contact)
    assert (str(message["conversation_id"]), message["body"]) == (conversation, "We got your request")
    assert counted("lead.created", "executed") - executed == 2
    assert counted("lead.created", "retry") - retry == 2
    assert unprocessed(runtime) == 0


def test_a_rule_that_keeps_failing_is_given_up_after_max_attempts(
    client: TestClient[Any], runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("the action broke")

    monkeypatch.setattr(AddLabel, "run", broken)
    ok = create_rule(client, "conversation.created", [add_tag("ok")])
    failing = create_rule(client, "conversation.created", [add_label("never")])
    contact = new_contact(client)
    before = {o: counted("conversation.created", o) for o in ("executed", "retry", "failed")}
    conversation = new_conversation(client, contact)

    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert process(runtime) == 1, attempt
        row = trigger_row(runtime)
        assert row["attempts"] == attempt
        assert "RuntimeError('the action broke')" in row["last_error"] and failing in row["last_error"]
        if attempt < MAX_ATTEMPTS:
            backoff = BACKOFF_MIN * 2 ** (attempt - 1)
            assert (row["outcome"], row["processed_at"]) == (None, None)
            assert row["next_attempt_at"] == runtime.clock.now() + backoff
            advance(runtime, backoff)

    assert (row["outcome"], row["processed_at"]) == ("failed", runtime.clock.now())
    advance(runtime, timedelta(days=1))
    assert process(runtime) == 0  # given up: never claimed again
    assert runs(client, ok) == [("executed", None)]
    assert runs(client, failing) == []
    assert tags_of(client, contact) == {"ok"}
    assert conversation_of(client, conversation)["labels"] == []
    after = {o: counted("conversation.created", o) - before[o] for o in before}
    assert after == {"executed": 1, "retry": MAX_ATTEMPTS - 1, "failed": 1}


def test_each_rule_outcome_is_counted_by_event_type(client: TestClient[Any], runtime: Runtime) -> None:
    executes = create_rule(client, "lead.created", [add_tag("lead")])
    rejected = create_rule(client, "lead.created", [add_label("no-conversation-to-label")])
    misses = create_rule(client, "lead.created", [add_tag("lost")], leaf("lead.status", "equal_to", "lost"))
    contact = new_contact(client)
    outcomes = ("executed", "rejected", "not_matched", "retry", "failed", "no_rule")
    before = {o: counted("lead.created", o) for o in outcomes}

    post_event(client, {"type": "lead.created", "contact_id": contact}, 201)
    assert process(runtime) == 1

    after = {o: counted("lead.created", o) - before[o] for o in outcomes}
    assert after == {"executed": 1, "rejected": 1, "not_matched": 1, "retry": 0, "failed": 0, "no_rule": 0}
    assert runs(client, executes) == [("executed", None)]
    assert runs(client, rejected) == [("rejected", "no_conversation")]
    assert runs(client, misses) == []


# --- 7. order ----------------------------------------------------------------------------------------------


def test_rules_on_one_event_run_in_position_order(client: TestClient[Any], runtime: Runtime) -> None:
    def labelled(name: str) -> list[dict[str, Any]]:
        return [add_label(name), {"type": "add_private_note", "text": name}]

    second = create_rule(client, "conversation.created", labelled("second"), position=5)
    first = create_rule(client, "conversation.created", labelled("first"), position=1)
    listed = client.get("/v1/rules", params={"event": "conversation.created"}).json()["items"]
    assert [rule["id"] for rule in listed] == [first, second]
    contact = new_contact(client)

    conversation = new_conversation(client, contact)
    assert process(runtime) == 1

    assert conversation_of(client, conversation)["labels"] == ["first", "second"]
    assert [n["text"] for n in notes(runtime, contact)] == ["first", "second"]
    [(count,)] = rows(runtime.pool, "SELECT count(*) FROM rule_runs")
    assert count == 2

    # reordered: the other runs first
    response = client.patch(f"/v1/rules/{second}", json={"position": 0})
    assert response.status_code == 200, response.text
    new_conversation(client, contact)
    assert process(runtime) == 1
    assert [n["text"] for n in notes(runtime, contact)] == ["first", "second", "second", "first"]
    assert runs(client, first) == runs(client, second) == [("executed", None)] * 2


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


# --- concurrency and isolation -----------------------------------------------------------------------------


def test_a_trigger_taken_over_after_its_lease_is_not_run_again_by_its_first_worker(
    client: TestClient[Any], runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's batch is slow (its first trigger waits on a lock) past the lease of its second trigger;
    another worker takes that one over, runs a rule, and fails on the next. The first worker must not run
    the taken-over trigger's rules again (nor ignore its backoff)."""

    def broken(*args: Any) -> None:
        raise RuntimeError("the action broke")

    monkeypatch.setattr(AssignTeam, "run", broken)
    create_rule(client, "conversation.created", [add_label("slow")])
    sender = create_rule(client, "lead.created", [{"type": "send_message", "text": "Hello once"}])
    create_rule(client, "lead.created", [{"type": "assign_team", "team": "sales"}])
    slow_contact, contact = new_contact(client), new_contact(client)

    with psycopg.connect(runtime.settings.database.url) as locker:
        slow_conversation = new_conversation(client, slow_contact)  # trigger 1
        post_event(client, {"type": "lead.created", "contact_id": contact}, 201)  # trigger 2
        locker.execute("SELECT id FROM conversations WHERE id = %s FOR UPDATE", (slow_conversation,))
        errors: list[BaseException] = []

        def first_worker() -> None:
            try:
                process_triggers(runtime.pool, runtime.clock)
            except BaseException as exc:  # reported by the test
                errors.append(exc)

        worker = threading.Thread(target=first_worker)
        worker.start()
        try:
            wait_until(
                lambda: rows(
                    runtime.pool,
                    "SELECT 1 FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'",
                ),
                what="the first worker waiting on the conversation",
            )
            advance(runtime, LEASE + timedelta(seconds=1))
            # the second worker takes over the trigger whose lease ran out: it sends, then fails
            assert process_triggers(runtime.pool, runtime.clock).triggers == 1
            taken_over = trigger_row(runtime, "lead.created")
            assert taken_over["attempts"] == 1
        finally:
            locker.rollback()
            worker.join(30)
    assert not worker.is_alive() and errors == []

    assert len(rule_messages(runtime, contact)) == 1
    assert runs(client, sender) == [("executed", None)]
    after = trigger_row(runtime, "lead.created")
    assert (after["attempts"], after["next_attempt_at"]) == (1, taken_over["next_attempt_at"])


def test_rules_fire_only_for_their_own_projects_events(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    rule = create_rule(client, "contact.created", [add_tag("ours")])

    response = client.post("/v1/contacts", json={"phone": new_phone()}, headers=other_project.headers)
    assert response.status_code == 201, response.text
    theirs = response.json()["id"]
    assert trigger_count(runtime) == 0
    ours = new_contact(client)
    assert process(runtime) == 1

    assert runs(client, rule) == [("executed", None)]
    assert tags_of(client, ours) == {"ours"}
    [(tags,)] = rows(runtime.pool, "SELECT tags FROM contacts WHERE id = %s", theirs)
    assert tags == []


def test_a_rule_that_resolves_the_conversation_stops_follow_ups_like_an_agent_would(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    """change_status resolved runs the conversation-resolved stop path (and counts it once committed)."""
    rule = create_rule(
        client,
        "message.created",
        [{"type": "change_status", "status": "resolved"}],
        {"all": [leaf("message.content", "contains", "thanks, solved")]},
    )
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    sequence = make_sequence(runtime.pool, project.id, stop_on=StopFlags(reply=False))
    enrolled = client.post("/v1/enrollments", json={"sequence_id": str(sequence), "contact_id": contact})
    assert enrolled.status_code == 201, enrolled.text
    before = (
        REGISTRY.get_sample_value(
            "whatstig_followup_finished_total", {"status": "stopped", "reason": "conversation_resolved"}
        )
        or 0.0
    )
    post_event(
        client,
        {
            "type": "message.inbound",
            "provider_message_id": "wamid.solved",
            "contact_id": contact,
            "conversation_id": conversation,
            "body": "Thanks, solved!",
        },
        201,
    )
    assert process(runtime) == 1
    assert runs(client, rule) == [("executed", None)]
    assert conversation_of(client, conversation)["status"] == "resolved"
    enrollment = client.get(f"/v1/enrollments/{enrolled.json()['id']}").json()["enrollment"]
    assert (enrollment["status"], enrollment["reason"]) == ("stopped", "conversation_resolved")
    after = REGISTRY.get_sample_value(
        "whatstig_followup_finished_total", {"status": "stopped", "reason": "conversation_resolved"}
    )
    assert after == before + 1
