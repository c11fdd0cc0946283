"""One change, one run per rule (issue 24, found 5): a change that adds several tags or labels is one
event, so each matching rule runs at most once for it, and a condition tests what the change added
(``event.tags_added``, ``event.labels_added``, ...). Rules through the API, changes through the API, the
triggers service's work run with ``process``, a delayed rule fired with ``sweep``."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.errors import InvalidInput
from libs.common.core.runtime import Runtime
from libs.common.platform.conditions import parse_segment
from tests.delayed_rule_helpers import assert_problem, fire, labels_of, set_time, the_one
from tests.rule_helpers import add_label, add_tag, create_rule, leaf, post_event, process
from tests.rule_trigger_helpers import (
    add_tags,
    new_contact,
    new_conversation,
    rule_messages,
    runs,
    tags_of,
    trigger_count,
)


def test_two_tags_in_one_request_run_a_matching_rule_once_and_a_condition_sees_what_was_added(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given the docs' rule on a tag being added, a delayed message on demo-booked, and one on another tag
    set_time(runtime, "2030-01-07T10:00")
    vip = create_rule(
        client,
        "contact.tag_added",
        [add_tag("nurtured")],
        leaf("contact.tags", "contains", "vip"),
    )
    demo = create_rule(
        client,
        "contact.tag_added",
        [{"type": "send_message", "text": "See you at the demo"}],
        leaf("event.tags_added", "contains", "demo-booked"),
        execution_delay_minutes=5,
    )
    other = create_rule(
        client, "contact.tag_added", [add_tag("never")], leaf("event.tags_added", "contains", "churned")
    )
    contact = new_contact(client)

    # When one request adds two tags
    add_tags(client, contact, "vip", "demo-booked")

    # Then one trigger was recorded, with both tags, and each matching rule ran (or scheduled) once
    assert trigger_count(runtime, "contact.tag_added") == 1
    assert process(runtime) == 1
    assert runs(client, vip) == [("executed", None)]
    assert runs(client, demo) == [("scheduled", None)]
    assert runs(client, other) == []
    assert tags_of(client, contact) == {"vip", "demo-booked", "nurtured"}

    # And the delayed message goes out once
    set_time(runtime, "2030-01-07T10:05")
    fire(runtime)
    assert the_one(client, demo)["status"] == "executed"
    assert [m["body"] for m in rule_messages(runtime, contact)] == ["See you at the demo"]

    # And a later change that adds another tag does not match the demo rule again
    add_tags(client, contact, "newsletter")
    process(runtime)
    assert runs(client, demo) == [("scheduled", None)]
    assert runs(client, vip) == [("executed", None)] * 2  # the docs' rule: the contact is still vip


def test_removing_tags_is_one_event_too_and_sees_what_was_removed(
    client: TestClient[Any], runtime: Runtime
) -> None:
    removed = create_rule(
        client, "contact.tag_removed", [add_tag("lost-vip")], leaf("event.tags_removed", "contains", "vip")
    )
    contact = new_contact(client, tags=["vip", "gold", "trial"])
    response = client.delete(f"/v1/contacts/{contact}/tags/vip")
    assert response.status_code == 200, response.text
    response = client.delete(f"/v1/contacts/{contact}/tags/gold")
    assert response.status_code == 200, response.text
    assert process(runtime) == 2
    assert runs(client, removed) == [("executed", None)]
    assert tags_of(client, contact) == {"trial", "lost-vip"}


def test_two_labels_in_one_change_run_a_conversation_rule_once_with_labels_added(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given a rule on conversation updates that add the urgent label
    urgent = create_rule(
        client,
        "conversation.updated",
        [{"type": "add_private_note", "text": "escalated"}],
        leaf("event.labels_added", "contains", "urgent"),
    )
    gone = create_rule(
        client,
        "conversation.updated",
        [add_label("was-billing")],
        leaf("event.labels_removed", "contains", "billing"),
    )
    contact = new_contact(client)
    conversation = new_conversation(client, contact)

    # When one event adds two labels
    post_event(
        client,
        {"type": "conversation.updated", "conversation_id": conversation, "labels": ["urgent", "billing"]},
    )
    # and another changes the assignee only (urgent is still on, but this change did not add it)
    post_event(client, {"type": "conversation.updated", "conversation_id": conversation, "assignee": "ana"})
    # and a third takes billing off
    post_event(
        client, {"type": "conversation.updated", "conversation_id": conversation, "labels": ["urgent"]}
    )

    # Then the urgent rule ran once, for the change that added it; the billing rule once, for its removal
    assert trigger_count(runtime, "conversation.updated") == 3
    process(runtime)
    assert runs(client, urgent) == [("executed", None)]
    assert runs(client, gone) == [("executed", None)]
    assert set(labels_of(client, conversation)) == {"urgent", "was-billing"}


def test_an_event_field_on_a_rule_of_another_event_is_refused_naming_the_leaf(
    client: TestClient[Any],
) -> None:
    body = {
        "name": "wrong event",
        "event": "conversation.updated",
        "conditions": {"all": [leaf("event.tags_added", "contains", "vip")]},
        "actions": [add_label("x")],
    }
    assert_problem(client.post("/v1/rules", json=body), 422, "conditions.all.0.attribute")
    body |= {"event": "contact.tag_added", "conditions": leaf("event.labels_added", "contains", "x")}
    assert_problem(client.post("/v1/rules", json=body), 422, "conditions.attribute")

    # changing a rule's event keeps the check: a tag rule cannot become a conversation rule with tags_added
    rule = create_rule(
        client, "contact.tag_added", [add_tag("x")], leaf("event.tags_added", "contains", "vip")
    )
    response = client.patch(f"/v1/rules/{rule}", json={"event": "conversation.updated"})
    assert_problem(response, 422, "conditions.attribute")

    # a list field takes list operators only
    body |= {"conditions": leaf("event.tags_added", "starts_with", "v")}
    assert_problem(client.post("/v1/rules", json=body), 422, "conditions.operator")


def test_a_segment_has_no_event_so_it_refuses_the_event_fields() -> None:
    for name in ("event.tags_added", "event.labels_removed"):
        with pytest.raises(InvalidInput) as refused:
            parse_segment(leaf(name, "contains", "vip"))
        assert refused.value.field == "segment.attribute"
