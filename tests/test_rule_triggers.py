"""Which events make a rule fire, end to end through the API: a rule is created with ``POST /v1/rules``,
its event is caused through the API (contacts, tags, ``POST /v1/events``), the triggers service's work is run
(``process_triggers`` until it finds nothing due) and the effect is read back through the API (SQL where the
API has no read).

Covered: every rule event fires, and only when an active rule listens; every condition operator in a rule
that fires and one that does not.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from tests.factories import new_phone
from tests.helpers import rows
from tests.rule_helpers import add_label, add_tag, create_rule, leaf, post_event, process
from tests.rule_trigger_helpers import (
    add_tags,
    contact_of,
    conversation_of,
    counted,
    new_contact,
    new_conversation,
    notes,
    runs,
    tags_of,
    trigger_count,
    unprocessed,
)

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


def test_tag_added_and_tag_removed_fire_once_per_change_with_the_tags_it_changed(
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

    assert trigger_count(runtime, "contact.tag_added") == 1
    found = rows(
        runtime.pool,
        "SELECT payload ->> 'tag', payload -> 'tags_added' FROM followup_triggers WHERE contact_id = %s",
        contact,
    )
    assert found == [("new, vip", ["new", "vip"])]
    assert process(runtime) == 1
    assert tags_of(client, contact) == {"old", "vip", "new", "tagged"}
    assert runs(client, added) == [("executed", None)]

    response = client.delete(f"/v1/contacts/{contact}/tags/vip")
    assert response.status_code == 200, response.text
    assert trigger_count(runtime, "contact.tag_removed") == 1
    assert process(runtime) == 1
    assert tags_of(client, contact) == {"old", "new", "tagged", "untagged"}
    assert runs(client, removed) == [("executed", None)]
    assert runs(client, added) == [("executed", None)]


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
