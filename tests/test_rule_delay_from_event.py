"""Delays count from the event (issue 24, found 6; seed 002 sections 4, 5.2 and 5.3): a delayed rule whose
conditions do not involve the conversation's status is due at the event + its delay, on a conversation of
any age; a status rule still counts from when the status was entered; one occurrence per episode (the clock
is not reset); an erased contact's pending executions are skipped ``contact_erased``.

A status rule counting from when the status was entered, with a note that does not reset the clock, is
seed 002's story 1 in ``tests/test_delayed_rules.py``; here, the same rule on a conversation long in its
status. Rules and events through the API, time driven by the ManualClock, triggers processed with
``process_triggers`` and due executions fired with ``sweep``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from tests.delayed_rule_helpers import (
    PENDING,
    at,
    change_status,
    counted,
    due,
    fire,
    labels_of,
    new_contact,
    new_conversation,
    of_rule,
    outcome,
    private_note,
    set_time,
    the_one,
)
from tests.rule_helpers import add_label, create_rule, leaf, post_event, process


def escalation_rule(client: TestClient[Any]) -> str:
    """The issue's rule: a conversation update with the urgent label, a minute later add escalated."""
    return create_rule(
        client,
        "conversation.updated",
        [add_label("escalated")],
        leaf("conversation.labels", "contains", "urgent"),
        execution_delay_minutes=1,
    )


def test_a_rule_without_the_status_on_a_two_day_old_conversation_fires_at_the_event_plus_its_delay(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given a conversation opened two days ago, and the escalation rule
    set_time(runtime, "2030-01-05T09:00")
    conversation = new_conversation(client)
    rule = escalation_rule(client)

    # When it is labelled urgent now
    set_time(runtime, "2030-01-07T10:00")
    post_event(
        client, {"type": "conversation.updated", "conversation_id": conversation, "labels": ["urgent"]}
    )
    process(runtime)

    # Then its execution is due a minute after the event, not two days ago
    execution = the_one(client, rule)
    assert (outcome(execution), due(execution)) == (("pending", None), at("2030-01-07T10:01"))

    # And another update of the same episode 30 s later does not reset the clock (nor add a row)
    set_time(runtime, "2030-01-07T10:00:30")
    private_note(client, conversation)
    process(runtime)
    fire(runtime)
    assert due(the_one(client, rule)) == at("2030-01-07T10:01")
    assert outcome(the_one(client, rule)) == ("pending", None)
    assert "escalated" not in labels_of(client, conversation)

    # And at its time it runs (not skipped expired)
    set_time(runtime, "2030-01-07T10:01")
    fire(runtime)
    assert outcome(the_one(client, rule)) == ("executed", None)
    assert set(labels_of(client, conversation)) == {"urgent", "escalated"}


def test_a_status_rule_on_a_conversation_long_in_its_status_runs_at_once_rather_than_expiring(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given a conversation Pending for three days, and the rule created only now
    set_time(runtime, "2030-01-04T10:00")
    conversation = new_conversation(client)
    change_status(client, conversation, "pending")
    set_time(runtime, "2030-01-07T10:00")
    rule = create_rule(
        client,
        "conversation.updated",
        [add_label("stale-pending")],
        {"all": [PENDING, leaf("changed", "contains", "conversation.private_note")]},
        execution_delay_minutes=240,
    )

    # When the conversation is touched
    private_note(client, conversation)
    process(runtime)

    # Then the row is due when it entered Pending + 4 h (long past), and the next sweep runs it
    assert due(the_one(client, rule)) == at("2030-01-04T14:00")
    fire(runtime)
    assert outcome(the_one(client, rule)) == ("executed", None)
    assert "stale-pending" in labels_of(client, conversation)


def test_an_erased_contacts_pending_executions_are_skipped_contact_erased(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given a pending execution of a contact rule and of a conversation rule, both of one contact
    set_time(runtime, "2030-01-07T10:00")
    tagged = create_rule(
        client,
        "contact.tag_added",
        [{"type": "send_message", "text": "hello"}],
        leaf("event.tags_added", "contains", "trial"),
        execution_delay_minutes=30,
    )
    escalation = escalation_rule(client)
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    response = client.post(f"/v1/contacts/{contact}/tags", json={"tags": ["trial"]})
    assert response.status_code == 200, response.text
    post_event(
        client, {"type": "conversation.updated", "conversation_id": conversation, "labels": ["urgent"]}
    )
    process(runtime)
    assert [outcome(e) for rule in (tagged, escalation) for e in of_rule(client, rule)] == [
        ("pending", None)
    ] * 2
    before = counted("skipped", "contact_erased")

    # When the contact is erased
    post_event(client, {"type": "contact.erased", "contact_id": contact})

    # Then both are skipped contact_erased at once (not expired later), counted once each
    for rule in (tagged, escalation):
        assert outcome(the_one(client, rule)) == ("skipped", "contact_erased")
    assert counted("skipped", "contact_erased") == before + 2

    # And at their time nothing runs and nothing changes
    set_time(runtime, "2030-01-07T10:30")
    assert fire(runtime).claimed == 0
    for rule in (tagged, escalation):
        assert outcome(the_one(client, rule)) == ("skipped", "contact_erased")
    runtime.clock.advance(timedelta(days=2))  # type: ignore[attr-defined]
    assert fire(runtime).claimed == 0
