"""Delayed rules end to end (seed 002): the five user stories of seed 002 section 6, each row of
their tables one assertion (stuck in pending, reply chase, long-open escalation, immediate rules untouched,
lifecycle while pending), and the reply chase cancelled by a customer reply one second before it is due.

Rules created through the API, events caused through ``POST /v1/events``, time driven by the ManualClock,
triggers processed with ``process_triggers`` (which records the pending executions of delayed rules) and
due executions fired with ``sweep``. Results read back through ``GET /v1/rules/{id}/executions``,
``GET /v1/conversations/{id}/rule-executions`` and ``GET /v1/conversations/{id}`` (SQL for messages and rows
the API cannot show).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from tests.conftest import Project
from tests.delayed_rule_helpers import (
    FOLLOW_UP,
    PENDING,
    agent_replies,
    assert_problem,
    at,
    change_status,
    counted,
    customer_writes,
    due,
    fire,
    labels_of,
    new_contact,
    new_conversation,
    of_conversation,
    of_rule,
    outcome,
    patch_rule,
    pending_since_ten,
    private_note,
    reply_chase_rule,
    rule_messages,
    set_time,
    stuck_in_pending_rule,
    the_one,
)
from tests.helpers import rows
from tests.rule_helpers import add_label, create_rule, post_event, process
from tests.rule_trigger_helpers import conversation_of

OPEN = {"attribute": "conversation.status", "operator": "equal_to", "value": "open"}


def rule_runs(client: TestClient[Any], rule_id: str) -> list[tuple[str, str | None]]:
    """What the rule did with its triggers, oldest first: (outcome, reason)."""
    response = client.get(f"/v1/rules/{rule_id}/runs")
    assert response.status_code == 200, response.text
    return [(run["outcome"], run["reason"]) for run in reversed(response.json()["items"])]


# --- story 1: label conversations stuck in Pending ---------------------------------------------------------


def test_story_1_a_conversation_still_pending_after_4_hours_is_labelled_once_per_episode(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T09:00")
    rule = stuck_in_pending_rule(client)
    conversation = new_conversation(client)

    # moves to Pending at 10:00 -> a pending execution, due 14:00
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")
    process(runtime)
    first = the_one(client, rule)
    assert (outcome(first), due(first)) == (("pending", None), at("2030-01-07T14:00"))
    assert rule_runs(client, rule) == [("scheduled", None)]

    # a private note at 11:30 (another conversation.updated) -> same episode, no new row, still due 14:00
    set_time(runtime, "2030-01-07T11:30")
    private_note(client, conversation)
    assert process(runtime) == 1
    again = the_one(client, rule)
    assert (again["id"], outcome(again), due(again)) == (
        first["id"],
        ("pending", None),
        at("2030-01-07T14:00"),
    )

    # nothing before its time
    set_time(runtime, "2030-01-07T13:59")
    assert fire(runtime).claimed == 0
    assert "stale-pending" not in labels_of(client, conversation)

    # still Pending at the 14:00 sweep -> the label is added, the row executed
    set_time(runtime, "2030-01-07T14:00")
    assert fire(runtime).claimed == 1
    assert labels_of(client, conversation) == ["stale-pending"]
    done = the_one(client, rule)
    assert outcome(done) == ("executed", None)
    assert datetime.fromisoformat(done["executed_at"]) == at("2030-01-07T14:00")
    assert done["message_id"] is None

    # reopens and goes Pending again the next day -> a new episode with a fresh 4-hour timer
    set_time(runtime, "2030-01-08T09:00")
    change_status(client, conversation, "open")
    process(runtime)
    set_time(runtime, "2030-01-08T10:30")
    change_status(client, conversation, "pending")
    process(runtime)
    second, old = of_rule(client, rule)
    assert old["id"] == first["id"] and outcome(old) == ("executed", None)
    assert (outcome(second), due(second)) == (("pending", None), at("2030-01-08T14:30"))
    assert second["episode_key"] != old["episode_key"]


def test_story_1_a_conversation_resolved_before_the_due_time_is_skipped(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T09:00")
    rule = stuck_in_pending_rule(client)
    conversation = new_conversation(client)
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")
    process(runtime)

    # resolved at 13:00 -> at 14:00 the row is skipped; the status change moved status_changed_at, so the
    # episode guard (before the conditions re-check) is the one that skips it
    set_time(runtime, "2030-01-07T13:00")
    post_event(client, {"type": "conversation.resolved", "conversation_id": conversation})
    process(runtime)
    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)
    skipped = the_one(client, rule)
    assert outcome(skipped) == ("skipped", "episode_moved")
    assert datetime.fromisoformat(skipped["executed_at"]) == at("2030-01-07T14:00")
    assert labels_of(client, conversation) == []


def test_a_pending_execution_cancelled_by_hand_never_runs(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    # Given a conversation stuck in Pending, its rule's execution due at 14:00
    set_time(runtime, "2030-01-07T09:00")
    rule = stuck_in_pending_rule(client)
    conversation = new_conversation(client)
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")
    process(runtime)
    pending = the_one(client, rule)
    path = f"/v1/rules/{rule}/executions/{pending['id']}/cancel"
    # another project cannot see it, nor another rule's path
    assert client.post(path, headers=other_project.headers).status_code == 404
    other_rule = stuck_in_pending_rule(client)
    assert_problem(
        client.post(f"/v1/rules/{other_rule}/executions/{pending['id']}/cancel"), 404, "execution_id"
    )
    before = counted("skipped", "cancelled")
    # When it is cancelled by hand at 12:00
    set_time(runtime, "2030-01-07T12:00")
    response = client.post(path)
    assert response.status_code == 200, response.text
    assert outcome(response.json()) == ("skipped", "cancelled")
    assert counted("skipped", "cancelled") - before == 1
    # Then at 14:00 nothing is claimed and no label is added; a second cancel is a conflict
    set_time(runtime, "2030-01-07T14:00")
    assert fire(runtime).claimed == 0
    assert labels_of(client, conversation) == []
    assert outcome(the_one(client, rule)) == ("skipped", "cancelled")
    assert client.post(path).status_code == 409


def test_story_1_leaving_pending_and_coming_back_restarts_the_clock(
    client: TestClient[Any], runtime: Runtime
) -> None:
    """ "Lets the fire-time check confirm the status held continuously, not just coincidentally at both
    endpoints": pending at 10:00 and at 14:00, but open from 11:00 to 12:00."""
    set_time(runtime, "2030-01-07T09:00")
    rule = stuck_in_pending_rule(client)
    conversation = new_conversation(client)
    for moment, status in (("10:00", "pending"), ("11:00", "open"), ("12:00", "pending")):
        set_time(runtime, f"2030-01-07T{moment}")
        change_status(client, conversation, status)
        process(runtime)

    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)
    newer, older = of_rule(client, rule)
    assert (outcome(older), due(older)) == (("skipped", "episode_moved"), at("2030-01-07T14:00"))
    assert (outcome(newer), due(newer)) == (("pending", None), at("2030-01-07T16:00"))
    assert labels_of(client, conversation) == []

    set_time(runtime, "2030-01-07T16:00")
    fire(runtime)
    assert outcome(of_rule(client, rule)[0]) == ("executed", None)
    assert labels_of(client, conversation) == ["stale-pending"]


# --- story 2: follow up when the customer goes quiet -------------------------------------------------------


def test_story_2_the_follow_up_tracks_the_latest_agent_reply_and_is_sent_exactly_once(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T14:00")
    rule = reply_chase_rule(client)
    contact = new_contact(client)
    conversation = customer_writes(client, contact)
    process(runtime)
    assert of_rule(client, rule) == []  # the customer's message is not outgoing

    # the agent replies Monday 15:00 -> pending, due Tuesday 15:00
    set_time(runtime, "2030-01-07T15:00")
    agent_replies(client, conversation)
    process(runtime)
    first = the_one(client, rule)
    assert (outcome(first), due(first)) == (("pending", None), at("2030-01-08T15:00"))

    # two more replies Monday 15:10 -> still one row, due follows the latest agent reply
    set_time(runtime, "2030-01-07T15:10")
    agent_replies(client, conversation)
    process(runtime)
    agent_replies(client, conversation)
    process(runtime)
    moved = the_one(client, rule)
    assert (moved["id"], outcome(moved), due(moved)) == (
        first["id"],
        ("pending", None),
        at("2030-01-08T15:10"),
    )

    # ... forward only: a reply whose trigger is older (a late worker) never moves it back
    set_time(runtime, "2030-01-07T15:05")
    agent_replies(client, conversation)
    process(runtime)
    assert due(the_one(client, rule)) == at("2030-01-08T15:10")

    # the customer never replies -> Tuesday ~15:10 the follow-up is queued, exactly once
    set_time(runtime, "2030-01-08T15:00")
    assert fire(runtime).claimed == 0
    assert rule_messages(runtime, contact) == []
    set_time(runtime, "2030-01-08T15:12")
    assert fire(runtime).claimed == 1
    [message] = rule_messages(runtime, contact)
    assert (message["direction"], message["status"], message["source"]) == ("outbound", "QUEUED", "rule")
    assert (message["body"], str(message["conversation_id"])) == (FOLLOW_UP, conversation)
    done = the_one(client, rule)
    assert (outcome(done), done["message_id"]) == (("executed", None), str(message["id"]))
    assert conversation_of(client, conversation)["last_outgoing_message_id"] == str(message["id"])

    # the follow-up itself is created by the rule -> no trigger, no new pending row (the loop guard)
    assert process(runtime) == 0
    set_time(runtime, "2030-01-10T15:12")
    assert fire(runtime).claimed == 0
    assert len(of_rule(client, rule)) == 1
    assert len(rule_messages(runtime, contact)) == 1


def test_story_2_a_customer_reply_cancels_the_follow_up(client: TestClient[Any], runtime: Runtime) -> None:
    set_time(runtime, "2030-01-07T14:00")
    rule = reply_chase_rule(client)
    contact = new_contact(client)
    conversation = customer_writes(client, contact)
    set_time(runtime, "2030-01-07T15:00")
    agent_replies(client, conversation)
    process(runtime)

    # the customer replies Monday 18:00 -> at fire time the episode guard skips it
    set_time(runtime, "2030-01-07T18:00")
    customer_writes(client, contact, conversation)
    process(runtime)
    assert outcome(the_one(client, rule)) == ("pending", None)
    set_time(runtime, "2030-01-08T15:00")
    fire(runtime)
    assert outcome(the_one(client, rule)) == ("skipped", "episode_moved")
    assert rule_messages(runtime, contact) == []


def test_a_customer_reply_one_second_before_the_follow_up_is_due_cancels_it(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T14:00")
    rule = reply_chase_rule(client)
    contact = new_contact(client)
    conversation = customer_writes(client, contact)
    set_time(runtime, "2030-01-07T15:00")
    agent_replies(client, conversation)
    process(runtime)

    set_time(runtime, "2030-01-08T14:59:59")
    customer_writes(client, contact, conversation)  # not even processed by the triggers service yet
    set_time(runtime, "2030-01-08T15:00")
    fire(runtime)
    assert outcome(the_one(client, rule)) == ("skipped", "episode_moved")
    assert rule_messages(runtime, contact) == []


def test_a_reply_after_the_customer_answered_opens_a_new_waiting_episode(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T14:00")
    rule = reply_chase_rule(client)
    contact = new_contact(client)
    conversation = customer_writes(client, contact)
    set_time(runtime, "2030-01-07T15:00")
    agent_replies(client, conversation)
    process(runtime)
    set_time(runtime, "2030-01-07T18:00")
    customer_writes(client, contact, conversation)
    set_time(runtime, "2030-01-07T18:30")
    agent_replies(client, conversation)
    process(runtime)

    newer, older = of_rule(client, rule)
    assert (outcome(older), due(older)) == (("pending", None), at("2030-01-08T15:00"))
    assert (outcome(newer), due(newer)) == (("pending", None), at("2030-01-08T18:30"))
    set_time(runtime, "2030-01-08T18:30")
    fire(runtime)
    newer, older = of_rule(client, rule)
    assert (outcome(older), outcome(newer)) == (("skipped", "episode_moved"), ("executed", None))
    assert len(rule_messages(runtime, contact)) == 1


# --- story 3: escalation label on long-open conversations --------------------------------------------------


def sla_risk_rule(client: TestClient[Any]) -> str:
    return create_rule(
        client, "conversation.created", [add_label("sla-risk")], OPEN, execution_delay_minutes=2880
    )


def test_story_3_a_conversation_still_open_after_48_hours_gets_sla_risk(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-02T09:00")  # a Wednesday
    rule = sla_risk_rule(client)
    conversation = new_conversation(client)
    process(runtime)
    assert due(the_one(client, rule)) == at("2030-01-04T09:00")
    set_time(runtime, "2030-01-04T09:00")  # Friday
    fire(runtime)
    assert labels_of(client, conversation) == ["sla-risk"]
    assert outcome(the_one(client, rule)) == ("executed", None)


def test_story_3_resolved_thursday_no_label(client: TestClient[Any], runtime: Runtime) -> None:
    set_time(runtime, "2030-01-02T09:00")
    rule = sla_risk_rule(client)
    conversation = new_conversation(client)
    process(runtime)
    set_time(runtime, "2030-01-03T12:00")
    post_event(client, {"type": "conversation.resolved", "conversation_id": conversation})
    process(runtime)
    set_time(runtime, "2030-01-04T09:00")
    fire(runtime)
    assert outcome(the_one(client, rule)) == ("skipped", "episode_moved")
    assert labels_of(client, conversation) == []


def test_story_3_resolved_thursday_reopened_friday_no_label_from_the_old_timer(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-02T09:00")
    rule = sla_risk_rule(client)
    conversation = new_conversation(client)
    process(runtime)
    set_time(runtime, "2030-01-03T12:00")
    post_event(client, {"type": "conversation.resolved", "conversation_id": conversation})
    set_time(runtime, "2030-01-04T08:00")
    post_event(client, {"type": "conversation.opened", "conversation_id": conversation})
    process(runtime)
    set_time(runtime, "2030-01-04T09:00")
    fire(runtime)
    assert conversation_of(client, conversation)["status"] == "open"  # the condition holds again ...
    assert outcome(the_one(client, rule)) == ("skipped", "episode_moved")  # ... but the episode ended
    assert labels_of(client, conversation) == []


# --- story 4: existing rules are untouched -----------------------------------------------------------------


def test_story_4_a_rule_without_delay_runs_at_once_and_stays_immediate_when_edited(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = create_rule(client, "conversation.updated", [add_label("pending-now")], PENDING)
    read = client.get(f"/v1/rules/{rule}").json()
    assert (read["execution_delay_minutes"], read["runs_after"]) == (None, "immediately")

    # any existing rule fires -> the immediate path: the action runs when the trigger is processed
    conversation = new_conversation(client)
    change_status(client, conversation, "pending")
    process(runtime)
    assert labels_of(client, conversation) == ["pending-now"]
    assert rule_runs(client, rule) == [("executed", None)]
    assert of_rule(client, rule) == [] and of_conversation(client, conversation) == []

    # edited without touching the delay -> still immediate
    edited = patch_rule(client, rule, name="renamed", actions=[add_label("pending-again")])
    assert (edited["execution_delay_minutes"], edited["runs_after"]) == (None, "immediately")
    other = new_conversation(client)
    change_status(client, other, "pending")
    process(runtime)
    assert labels_of(client, other) == ["pending-again"]
    assert rule_runs(client, rule) == [("executed", None), ("executed", None)]
    assert of_rule(client, rule) == []
    [(count,)] = rows(runtime.pool, "SELECT count(*) FROM rule_pending_executions")
    assert count == 0


# --- story 5: the rule's lifecycle while a timer is pending ------------------------------------------------


def test_story_5_a_rule_disabled_while_pending_skips_its_rows(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = stuck_in_pending_rule(client)
    conversations = [pending_since_ten(client, runtime, rule) for _ in range(2)]
    response = client.post(f"/v1/rules/{rule}/disable")
    assert response.status_code == 200, response.text
    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)
    assert [outcome(e) for e in of_rule(client, rule)] == [("skipped", "rule_inactive")] * 2
    for conversation in conversations:
        assert labels_of(client, conversation) == []


def test_story_5_deleting_the_rule_removes_its_pending_rows(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = stuck_in_pending_rule(client)
    kept = create_rule(
        client, "conversation.updated", [add_label("kept")], PENDING, execution_delay_minutes=240
    )
    conversation = pending_since_ten(client, runtime, rule)
    assert len(of_conversation(client, conversation)) == 2

    response = client.delete(f"/v1/rules/{rule}")
    assert response.status_code == 204, response.text
    assert client.get(f"/v1/rules/{rule}/executions").status_code == 404
    [(count,)] = rows(
        runtime.pool, "SELECT count(*) FROM rule_pending_executions WHERE rule_id = %s", uuid.UUID(rule)
    )
    assert count == 0
    [left] = of_conversation(client, conversation)
    assert left["rule_id"] == kept
    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)
    assert labels_of(client, conversation) == ["kept"]


def test_story_5_a_new_delay_applies_to_new_episodes_only(client: TestClient[Any], runtime: Runtime) -> None:
    rule = stuck_in_pending_rule(client)
    earlier = pending_since_ten(client, runtime, rule)

    set_time(runtime, "2030-01-07T10:30")
    assert patch_rule(client, rule, execution_delay_minutes=480)["runs_after"] == "8h"
    # the row already pending keeps its due time, also when its episode's events go on
    private_note(client, earlier)
    process(runtime)
    [kept] = of_conversation(client, earlier)
    assert due(kept) == at("2030-01-07T14:00")

    # a new episode counts the new delay
    later = new_conversation(client)
    set_time(runtime, "2030-01-07T11:00")
    change_status(client, later, "pending")
    process(runtime)
    [fresh] = of_conversation(client, later)
    assert due(fresh) == at("2030-01-07T19:00")

    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)
    assert outcome(of_conversation(client, earlier)[0]) == ("executed", None)
    assert outcome(of_conversation(client, later)[0]) == ("pending", None)


def test_story_5_the_re_check_uses_the_edited_conditions(client: TestClient[Any], runtime: Runtime) -> None:
    rule = stuck_in_pending_rule(client)
    plain = pending_since_ten(client, runtime, rule)
    vip = pending_since_ten(client, runtime, rule)

    set_time(runtime, "2030-01-07T11:00")
    vip_pending = {
        "all": [PENDING, {"attribute": "conversation.labels", "operator": "contains", "value": "vip"}]
    }
    patch_rule(client, rule, conditions=vip_pending)
    post_event(client, {"type": "conversation.updated", "conversation_id": vip, "labels": ["vip"]})
    process(runtime)

    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)
    assert outcome(of_conversation(client, plain)[0]) == ("skipped", "conditions_changed")
    assert labels_of(client, plain) == []
    assert outcome(of_conversation(client, vip)[0]) == ("executed", None)
    assert labels_of(client, vip) == ["stale-pending", "vip"]


def test_story_5_a_deleted_conversation_keeps_its_row_skipped_conversation_gone(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = stuck_in_pending_rule(client)
    conversation = pending_since_ten(client, runtime, rule)
    [row] = of_rule(client, rule)

    # there is no API to delete a conversation
    with runtime.pool.connection() as conn:
        conn.execute("DELETE FROM conversations WHERE id = %s", (uuid.UUID(conversation),))
    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)
    gone = the_one(client, rule)
    assert gone["id"] == row["id"]
    assert outcome(gone) == ("skipped", "conversation_gone")
    assert client.get(f"/v1/conversations/{conversation}/rule-executions").status_code == 404
