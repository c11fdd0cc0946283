"""A delayed rule's pending execution per episode (seed 002): one per event when there is no
conversation, the awaiting-agent episode ended by an agent's reply, rows found past the staleness limit
(expired), an action refused at fire time, and several events of one episode in one trigger batch.

Rules created through the API, events caused through ``POST /v1/events``, time driven by the ManualClock,
triggers processed with ``process_triggers`` (which records the pending executions of delayed rules) and
due executions fired with ``sweep``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from tests.delayed_rule_helpers import (
    agent_replies,
    at,
    change_status,
    customer_writes,
    due,
    fire,
    labels_of,
    new_contact,
    new_conversation,
    of_conversation,
    of_rule,
    outcome,
    pending_since_ten,
    private_note,
    reply_chase_rule,
    rule_messages,
    set_time,
    stuck_in_pending_rule,
    the_one,
)
from tests.rule_helpers import add_label, create_rule, post_event, process
from tests.rule_trigger_helpers import conversation_of

INCOMING = {"attribute": "message.type", "operator": "equal_to", "value": "incoming"}


# --- an event without a conversation ----------------------------------------------------------------------


def test_a_delayed_rule_on_a_contact_event_runs_once_per_event(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T10:00")
    rule = create_rule(
        client,
        "contact.tag_added",
        [{"type": "add_contact_tag", "tags": ["nudged"]}],
        {"attribute": "contact.tags", "operator": "contains", "value": "trial"},
        execution_delay_minutes=30,
    )
    contact = new_contact(client)
    response = client.post(f"/v1/contacts/{contact}/tags", json={"tags": ["trial"]})
    assert response.status_code == 200, response.text
    process(runtime)
    execution = the_one(client, rule)
    assert (execution["conversation_id"], execution["contact_id"]) == (None, contact)
    assert (outcome(execution), due(execution)) == (("pending", None), at("2030-01-07T10:30"))

    set_time(runtime, "2030-01-07T10:30")
    fire(runtime)
    assert outcome(the_one(client, rule)) == ("executed", None)
    assert set(client.get(f"/v1/contacts/{contact}").json()["tags"]) == {"trial", "nudged"}
    assert process(runtime) == 0  # the rule's tag fires nothing


# --- awaiting agent ----------------------------------------------------------------------------------------


def unanswered_rule(client: TestClient[Any]) -> str:
    return create_rule(
        client, "message.created", [add_label("unanswered")], INCOMING, execution_delay_minutes=60
    )


def test_awaiting_agent_an_agent_reply_ends_the_wait(client: TestClient[Any], runtime: Runtime) -> None:
    set_time(runtime, "2030-01-07T10:00")
    rule = unanswered_rule(client)
    contact = new_contact(client)
    conversation = customer_writes(client, contact)
    process(runtime)
    assert due(the_one(client, rule)) == at("2030-01-07T11:00")

    # the customer writes again: still waiting since 10:00, same episode
    set_time(runtime, "2030-01-07T10:20")
    customer_writes(client, contact, conversation)
    process(runtime)
    assert due(the_one(client, rule)) == at("2030-01-07T11:00")

    set_time(runtime, "2030-01-07T10:30")
    agent_replies(client, conversation)
    process(runtime)
    assert conversation_of(client, conversation)["waiting_since"] is None
    set_time(runtime, "2030-01-07T11:00")
    fire(runtime)
    assert outcome(the_one(client, rule)) == ("skipped", "episode_moved")
    assert labels_of(client, conversation) == []


def test_awaiting_agent_without_a_reply_the_label_is_added(client: TestClient[Any], runtime: Runtime) -> None:
    set_time(runtime, "2030-01-07T10:00")
    rule = unanswered_rule(client)
    contact = new_contact(client)
    conversation = customer_writes(client, contact)
    process(runtime)
    set_time(runtime, "2030-01-07T11:00")
    fire(runtime)
    assert outcome(the_one(client, rule)) == ("executed", None)
    assert labels_of(client, conversation) == ["unanswered"]


def test_anchors_with_microseconds_keep_their_episode(client: TestClient[Any], runtime: Runtime) -> None:
    """The key recorded from the trigger's JSON anchors and the one recomputed from the conversation at fire
    time agree to the microsecond (PostgreSQL's JSON drops trailing zeros of the fraction)."""
    set_time(runtime, "2030-01-07T09:00")
    pending_rule = stuck_in_pending_rule(client)
    waiting_rule = unanswered_rule(client)
    contact = new_contact(client)
    set_time(runtime, "2030-01-07T10:00:00.120000")
    conversation = customer_writes(client, contact)
    set_time(runtime, "2030-01-07T10:00:00.123456")
    change_status(client, conversation, "pending")
    process(runtime)
    assert due(the_one(client, waiting_rule)) == at("2030-01-07T11:00:00.120000")
    assert due(the_one(client, pending_rule)) == at("2030-01-07T14:00:00.123456")
    set_time(runtime, "2030-01-07T14:00:00.123456")
    fire(runtime)
    assert outcome(the_one(client, waiting_rule)) == ("executed", None)
    assert outcome(the_one(client, pending_rule)) == ("executed", None)
    assert labels_of(client, conversation) == ["stale-pending", "unanswered"]


# --- expired -----------------------------------------------------------------------------------------------


def test_a_row_found_later_than_the_staleness_limit_is_skipped_expired(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = stuck_in_pending_rule(client)
    late = pending_since_ten(client, runtime, rule)
    in_time = pending_since_ten(client, runtime, rule)
    with runtime.pool.connection() as conn:  # one of them is due ten minutes later
        conn.execute(
            "UPDATE rule_pending_executions SET due_at = due_at + interval '10 minutes'"
            " WHERE conversation_id = %s",
            (uuid.UUID(in_time),),
        )

    set_time(runtime, "2030-01-07T14:15")
    fire(runtime, stale_after=timedelta(minutes=10))
    assert outcome(of_conversation(client, late)[0]) == ("skipped", "expired")
    assert labels_of(client, late) == []
    assert outcome(of_conversation(client, in_time)[0]) == ("executed", None)
    assert labels_of(client, in_time) == ["stale-pending"]


# --- a refusal at fire time --------------------------------------------------------------------------------


def test_an_action_refused_at_fire_time_skips_the_row_with_the_refusal(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T14:00")
    rule = reply_chase_rule(client)
    contact = new_contact(client)
    conversation = customer_writes(client, contact)
    set_time(runtime, "2030-01-07T15:00")
    agent_replies(client, conversation)
    process(runtime)

    set_time(runtime, "2030-01-07T20:00")
    post_event(client, {"type": "contact.opted_out", "contact_id": contact})
    set_time(runtime, "2030-01-08T15:00")
    fire(runtime)
    refused = the_one(client, rule)
    assert (outcome(refused), refused["message_id"]) == (("skipped", "opted_out"), None)
    assert rule_messages(runtime, contact) == []


# --- one episode, several events in one batch --------------------------------------------------------------


def test_several_events_of_one_status_episode_in_one_trigger_batch_make_one_row(
    client: TestClient[Any], runtime: Runtime
) -> None:
    """The triggers worker claims up to 100 triggers at a time: the events of an update storm (a status
    change, then a note) may well be in one batch."""
    set_time(runtime, "2030-01-07T09:00")
    rule = stuck_in_pending_rule(client)
    conversation = new_conversation(client)
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")
    set_time(runtime, "2030-01-07T10:05")
    private_note(client, conversation)
    assert process(runtime) == 2
    execution = the_one(client, rule)
    assert (outcome(execution), due(execution)) == (("pending", None), at("2030-01-07T14:00"))


def test_two_agent_replies_in_one_trigger_batch_make_one_row_due_after_the_latest(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T14:00")
    rule = reply_chase_rule(client)
    contact = new_contact(client)
    conversation = customer_writes(client, contact)
    process(runtime)
    set_time(runtime, "2030-01-07T15:00")
    agent_replies(client, conversation)
    set_time(runtime, "2030-01-07T15:10")
    agent_replies(client, conversation)
    assert process(runtime) == 2
    execution = the_one(client, rule)
    assert (outcome(execution), due(execution)) == (("pending", None), at("2030-01-08T15:10"))


def test_an_event_processed_after_its_status_episode_ended_records_no_pending_row(
    client: TestClient[Any], runtime: Runtime
) -> None:
    """Seed 002, 5.3: "First event where conditions match -> pending row created". A backlog: the move to
    open (11:00) and back to pending (11:05) are processed together. The 11:00 event belongs to the open
    episode, in which the rule's condition (status pending) never held; only the 11:05 one opens a pending
    episode."""
    set_time(runtime, "2030-01-07T09:00")
    rule = stuck_in_pending_rule(client)
    conversation = new_conversation(client)
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")
    process(runtime)
    set_time(runtime, "2030-01-07T11:00")
    change_status(client, conversation, "open")
    set_time(runtime, "2030-01-07T11:05")
    change_status(client, conversation, "pending")
    assert process(runtime) == 2

    assert [due(e) for e in of_rule(client, rule)] == [at("2030-01-07T15:05"), at("2030-01-07T14:00")]
