"""Delayed rules end to end (seed 002): rules created through the API, events caused through
``POST /v1/events``, time driven by the ManualClock, triggers processed with ``process_triggers`` (which
records the pending executions of delayed rules) and due executions fired with ``sweep``; results read back
through ``GET /v1/rules/{id}/executions``, ``GET /v1/conversations/{id}/rule-executions`` and
``GET /v1/conversations/{id}`` (SQL for messages and rows the API cannot show).

Covered: the five user stories of seed 002 section 6, each row of their tables one assertion (stuck in
pending, reply chase, long-open escalation, immediate rules untouched, lifecycle while pending); the reply
chase cancelled by a customer reply one second before it is due; the awaiting-agent episode; expired rows;
delays counted in business hours (and the bad input around them and the delay); the ``runs_after`` badge;
the executions endpoints (pages, status filter, 404s, projects kept apart); an action refused at fire
time; the ``whatstig_rule_executions_total`` counter; several events of one episode in one trigger batch.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from litestar.testing import TestClient
from prometheus_client import REGISTRY

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.rules.executions import Swept, sweep
from tests.conftest import Project
from tests.factories import new_phone
from tests.helpers import rows
from tests.rule_helpers import add_label, create_rule, post_event, process

PROBLEM_JSON = "application/problem+json"
STALE_AFTER = timedelta(days=1)
PENDING = {"attribute": "conversation.status", "operator": "equal_to", "value": "pending"}
OPEN = {"attribute": "conversation.status", "operator": "equal_to", "value": "open"}
OUTGOING = {"attribute": "message.type", "operator": "equal_to", "value": "outgoing"}
INCOMING = {"attribute": "message.type", "operator": "equal_to", "value": "incoming"}
FOLLOW_UP = "Just checking in — did that solve it for you?"
NINE_TO_FIVE = {"start": "09:00", "end": "17:00", "days": ["mon", "tue", "wed", "thu", "fri"]}

# --- helpers -----------------------------------------------------------------------------------------------


def at(value: str) -> datetime:
    """A moment of the test calendar, in UTC (2030-01-07 is a Monday)."""
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def set_time(runtime: Runtime, value: str) -> None:
    clock = runtime.clock
    assert isinstance(clock, ManualClock)
    clock.set(at(value))


def send(text: str = FOLLOW_UP) -> dict[str, Any]:
    return {"type": "send_message", "text": text}


def patch_rule(client: TestClient[Any], rule_id: str, **fields: Any) -> dict[str, Any]:
    response = client.patch(f"/v1/rules/{rule_id}", json=fields)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def fire(runtime: Runtime, stale_after: timedelta = STALE_AFTER) -> Swept:
    """One sweep of the due delayed rules."""
    return sweep(runtime.pool, runtime.clock, stale_after=stale_after)


def new_contact(client: TestClient[Any]) -> str:
    response = client.post("/v1/contacts", json={"phone": new_phone()})
    assert response.status_code == 201, response.text
    contact_id: str = response.json()["id"]
    return contact_id


def new_conversation(client: TestClient[Any], contact_id: str | None = None) -> str:
    contact_id = contact_id or new_contact(client)
    result = post_event(client, {"type": "conversation.created", "contact_id": contact_id})
    conversation_id: str = result["conversation_id"]
    return conversation_id


def conversation_of(client: TestClient[Any], conversation_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/conversations/{conversation_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def labels_of(client: TestClient[Any], conversation_id: str) -> list[str]:
    labels: list[str] = conversation_of(client, conversation_id)["labels"]
    return labels


def change_status(client: TestClient[Any], conversation_id: str, status: str) -> None:
    post_event(
        client, {"type": "conversation.status_changed", "conversation_id": conversation_id, "status": status}
    )


def private_note(client: TestClient[Any], conversation_id: str, text: str = "called, no answer") -> None:
    post_event(
        client, {"type": "conversation.updated", "conversation_id": conversation_id, "private_note": text}
    )


def customer_writes(client: TestClient[Any], contact_id: str, conversation_id: str | None = None) -> str:
    event: dict[str, Any] = {
        "type": "message.inbound",
        "contact_id": contact_id,
        "provider_message_id": f"in-{uuid.uuid4()}",
        "body": "hello",
    }
    if conversation_id is not None:
        event["conversation_id"] = conversation_id
    written: str = post_event(client, event)["conversation_id"]
    return written


def agent_replies(client: TestClient[Any], conversation_id: str) -> None:
    post_event(client, {"type": "message.human", "conversation_id": conversation_id, "body": "Try this"})


def executions_page(
    client: TestClient[Any], path: str, headers: dict[str, str] | None = None, **params: Any
) -> dict[str, Any]:
    response = client.get(path, params=params, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def of_rule(client: TestClient[Any], rule_id: str, **params: Any) -> list[dict[str, Any]]:
    """The rule's executions, newest first."""
    items: list[dict[str, Any]] = executions_page(client, f"/v1/rules/{rule_id}/executions", **params)[
        "items"
    ]
    return items


def of_conversation(client: TestClient[Any], conversation_id: str, **params: Any) -> list[dict[str, Any]]:
    """The conversation's executions, newest first."""
    path = f"/v1/conversations/{conversation_id}/rule-executions"
    items: list[dict[str, Any]] = executions_page(client, path, **params)["items"]
    return items


def due(execution: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(execution["due_at"])


def outcome(execution: dict[str, Any]) -> tuple[str, str | None]:
    return execution["status"], execution["skip_reason"]


def the_one(client: TestClient[Any], rule_id: str) -> dict[str, Any]:
    """The rule's only execution."""
    [execution] = of_rule(client, rule_id)
    return execution


def rule_messages(runtime: Runtime, contact_id: str) -> list[dict[str, Any]]:
    with runtime.pool.connection() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT id, conversation_id, direction, status, source, body FROM messages"
            " WHERE contact_id = %s AND source = 'rule' ORDER BY created_at, id",
            (uuid.UUID(contact_id),),
        ).fetchall()


def rule_runs(client: TestClient[Any], rule_id: str) -> list[tuple[str, str | None]]:
    """What the rule did with its triggers, oldest first."""
    response = client.get(f"/v1/rules/{rule_id}/runs")
    assert response.status_code == 200, response.text
    return [(run["outcome"], run["detail"]) for run in reversed(response.json()["items"])]


def put_settings(client: TestClient[Any], **settings: Any) -> None:
    response = client.put("/v1/settings", json=settings)
    assert response.status_code == 200, response.text


def assert_problem(response: Any, status: int | tuple[int, ...], field: str) -> dict[str, Any]:
    """A problem-details body with ``status`` (one of them) naming ``field`` in ``errors``."""
    statuses = status if isinstance(status, tuple) else (status,)
    assert response.status_code in statuses, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body: dict[str, Any] = response.json()
    assert field in [error["field"] for error in body.get("errors", [])], body
    return body


def counted(outcome: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "whatstig_rule_executions_total", {"outcome": outcome, "reason": reason}
    )
    return value or 0.0


# --- story 1: label conversations stuck in Pending ---------------------------------------------------------


def stuck_in_pending_rule(client: TestClient[Any], delay: int = 240) -> str:
    return create_rule(
        client,
        "conversation.updated",
        [add_label("stale-pending")],
        PENDING,
        execution_delay_minutes=delay,
    )


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


def reply_chase_rule(client: TestClient[Any]) -> str:
    return create_rule(client, "message.created", [send(FOLLOW_UP)], OUTGOING, execution_delay_minutes=1440)


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


def pending_since_ten(client: TestClient[Any], runtime: Runtime, rule: str) -> str:
    """A conversation that went Pending at 10:00 (a row of ``rule`` due 14:00 with the 4 h delay)."""
    set_time(runtime, "2030-01-07T09:00")
    conversation = new_conversation(client)
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")
    process(runtime)
    return conversation


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


# --- business hours ----------------------------------------------------------------------------------------


def test_a_delay_in_business_hours_counts_open_time_only(client: TestClient[Any], runtime: Runtime) -> None:
    [(timezone,)] = rows(runtime.pool, "SELECT timezone FROM projects")
    assert timezone == "UTC"
    put_settings(client, business_hours=NINE_TO_FIVE)
    four = stuck_in_pending_rule(client, 240)
    patch_rule(client, four, delay_in_business_hours=True)
    three = create_rule(
        client,
        "conversation.updated",
        [add_label("three-hours")],
        PENDING,
        execution_delay_minutes=180,
        delay_in_business_hours=True,
    )

    def due_of(rule: str, conversation: str) -> datetime:
        [execution] = [e for e in of_conversation(client, conversation) if e["rule_id"] == rule]
        return due(execution)

    # Friday 16:00: one hour on Friday, then Monday from 09:00 (the "Monday 11:00" for 4 hours does
    # not add up: 1 h + 3 h is Monday 12:00; 3 business hours are Monday 11:00)
    set_time(runtime, "2030-01-04T16:00")
    friday = new_conversation(client)
    change_status(client, friday, "pending")
    process(runtime)
    assert due_of(four, friday) == at("2030-01-07T12:00")
    assert due_of(three, friday) == at("2030-01-07T11:00")

    # inside business hours it is plain time; on a Saturday it starts on Monday morning
    set_time(runtime, "2030-01-05T10:00")
    saturday = new_conversation(client)
    change_status(client, saturday, "pending")
    process(runtime)
    assert due_of(four, saturday) == at("2030-01-07T13:00")
    set_time(runtime, "2030-01-07T09:30")
    monday = new_conversation(client)
    change_status(client, monday, "pending")
    process(runtime)
    assert due_of(four, monday) == at("2030-01-07T13:30")

    set_time(runtime, "2030-01-07T11:00")
    fire(runtime)
    assert labels_of(client, friday) == ["three-hours"]
    set_time(runtime, "2030-01-07T12:00")
    fire(runtime)
    assert labels_of(client, friday) == ["stale-pending", "three-hours"]


def test_business_hours_are_counted_in_the_projects_time_zone(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    with runtime.pool.connection() as conn:  # UTC-3 all year
        conn.execute("UPDATE projects SET timezone = 'America/Sao_Paulo' WHERE id = %s", (project.id,))
    put_settings(client, business_hours=NINE_TO_FIVE)
    rule = create_rule(
        client,
        "conversation.updated",
        [add_label("stale-pending")],
        PENDING,
        execution_delay_minutes=240,
        delay_in_business_hours=True,
    )
    set_time(runtime, "2030-01-04T19:00")  # Friday 16:00 in São Paulo
    conversation = new_conversation(client)
    change_status(client, conversation, "pending")
    process(runtime)
    assert due(the_one(client, rule)) == at("2030-01-07T15:00")  # Monday 12:00 in São Paulo


def test_bad_delays_are_refused_naming_the_field(client: TestClient[Any], runtime: Runtime) -> None:
    body = {"name": "x", "event": "conversation.updated", "actions": [add_label("x")]}

    # business hours asked for, the project has none
    response = client.post(
        "/v1/rules", json=body | {"execution_delay_minutes": 240, "delay_in_business_hours": True}
    )
    assert "business_hours" in assert_problem(response, 422, "delay_in_business_hours")["detail"]
    rule = create_rule(client, "conversation.updated", [add_label("x")], execution_delay_minutes=240)
    response = client.patch(f"/v1/rules/{rule}", json={"delay_in_business_hours": True})
    assert_problem(response, 422, "delay_in_business_hours")

    # business hours without a delay to count in them
    put_settings(client, business_hours=NINE_TO_FIVE)
    response = client.post("/v1/rules", json=body | {"delay_in_business_hours": True})
    problem = assert_problem(response, 422, "delay_in_business_hours")
    assert "execution_delay_minutes" in problem["detail"]
    response = client.patch(
        f"/v1/rules/{rule}", json={"delay_in_business_hours": True, "execution_delay_minutes": None}
    )
    assert_problem(response, 422, "delay_in_business_hours")

    # out of bounds, or not a whole number of minutes
    for bad in (0, -5, 43_201, 1.5, "4h", True):
        response = client.post("/v1/rules", json=body | {"execution_delay_minutes": bad})
        assert_problem(response, (400, 422), "execution_delay_minutes")
        response = client.patch(f"/v1/rules/{rule}", json={"execution_delay_minutes": bad})
        assert_problem(response, (400, 422), "execution_delay_minutes")
    read = client.get(f"/v1/rules/{rule}").json()
    assert (read["execution_delay_minutes"], read["delay_in_business_hours"]) == (240, False)
    [(count,)] = rows(runtime.pool, "SELECT count(*) FROM rules")
    assert count == 1
    # the bounds themselves are fine
    for fine in (1, 43_200):
        assert patch_rule(client, rule, execution_delay_minutes=fine)["execution_delay_minutes"] == fine


# --- the runs_after badge ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "badge"),
    [(None, "immediately"), (45, "45m"), (240, "4h"), (1560, "1d 2h"), (1440, "1d"), (61, "1h 1m")],
)
def test_runs_after_shows_the_delay(client: TestClient[Any], delay: int | None, badge: str) -> None:
    rule = create_rule(client, "conversation.updated", [add_label("x")], execution_delay_minutes=delay)
    assert client.get(f"/v1/rules/{rule}").json()["runs_after"] == badge
    [listed] = client.get("/v1/rules").json()["items"]
    assert listed["runs_after"] == badge


# --- visibility --------------------------------------------------------------------------------------------


def test_both_executions_endpoints_page_newest_first_and_filter_by_status(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T09:00")
    rule = stuck_in_pending_rule(client)
    other_rule = create_rule(
        client, "conversation.updated", [add_label("x")], PENDING, execution_delay_minutes=600
    )
    conversations = [new_conversation(client) for _ in range(3)]
    for minute, conversation in enumerate(conversations):
        set_time(runtime, f"2030-01-07T10:0{minute}")
        change_status(client, conversation, "pending")
        process(runtime)
    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)  # the first conversation's row of ``rule`` is due
    first = conversations[0]
    # a second episode of the first conversation
    set_time(runtime, "2030-01-07T14:30")
    change_status(client, first, "open")
    process(runtime)
    set_time(runtime, "2030-01-07T14:40")
    change_status(client, first, "pending")
    process(runtime)

    # the rule: 4 rows, newest first, two at a time
    path = f"/v1/rules/{rule}/executions"
    page_one = executions_page(client, path, limit=2)
    page_two = executions_page(client, path, limit=2, after=page_one["next"])
    assert page_one["next"] == page_one["items"][-1]["id"] and page_two["next"] is None
    listed = page_one["items"] + page_two["items"]
    assert [e["conversation_id"] for e in listed] == [first, conversations[2], conversations[1], first]
    assert all(e["rule_id"] == rule for e in listed)
    created = [datetime.fromisoformat(e["created_at"]) for e in listed]
    assert created == sorted(created, reverse=True)
    assert [e["id"] for e in of_rule(client, rule, status="executed")] == [listed[3]["id"]]
    assert [e["id"] for e in of_rule(client, rule, status="pending")] == [e["id"] for e in listed[:3]]
    assert of_rule(client, rule, status="skipped") == []
    bad_queries: list[tuple[dict[str, Any], int, str]] = [
        ({"status": "done"}, 422, "status"),
        ({"limit": 0}, 422, "limit"),
        ({"limit": 501}, 422, "limit"),
        ({"after": "not-a-uuid"}, 400, "after"),
    ]
    for bad, status, field in bad_queries:
        assert_problem(client.get(path, params=bad), status, field)
        conversation_path = f"/v1/conversations/{first}/rule-executions"
        assert_problem(client.get(conversation_path, params=bad), status, field)

    # the conversation: its rows of every rule, newest first, and nothing of other conversations
    path = f"/v1/conversations/{first}/rule-executions"
    page_one = executions_page(client, path, limit=2)
    page_two = executions_page(client, path, limit=2, after=page_one["next"])
    assert page_two["next"] is None
    mine = page_one["items"] + page_two["items"]
    assert {e["conversation_id"] for e in mine} == {first}
    assert len(mine) == 4
    assert {(e["rule_id"], e["status"]) for e in mine[2:]} == {(rule, "executed"), (other_rule, "pending")}
    assert {(e["rule_id"], e["status"]) for e in mine[:2]} == {(rule, "pending"), (other_rule, "pending")}
    pending = of_conversation(client, first, status="pending")
    assert [e["id"] for e in pending] == [e["id"] for e in mine if e["status"] == "pending"]


def test_executions_of_unknown_or_other_projects_rules_and_conversations_are_404(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    theirs = other_project.headers
    response = client.post(
        "/v1/rules",
        headers=theirs,
        json={
            "name": "theirs",
            "event": "conversation.updated",
            "actions": [add_label("x")],
            "conditions": PENDING,
            "execution_delay_minutes": 60,
        },
    )
    assert response.status_code == 201, response.text
    their_rule = response.json()["id"]
    response = client.post("/v1/contacts", headers=theirs, json={"phone": new_phone()})
    their_contact = response.json()["id"]
    response = client.post(
        "/v1/events", headers=theirs, json={"type": "conversation.created", "contact_id": their_contact}
    )
    their_conversation = response.json()["conversation_id"]
    response = client.post(
        "/v1/events",
        headers=theirs,
        json={
            "type": "conversation.status_changed",
            "conversation_id": their_conversation,
            "status": "pending",
        },
    )
    assert response.status_code == 200, response.text
    process(runtime)
    assert len(executions_page(client, f"/v1/rules/{their_rule}/executions", headers=theirs)["items"]) == 1

    for path in (
        f"/v1/rules/{their_rule}/executions",
        f"/v1/conversations/{their_conversation}/rule-executions",
        f"/v1/rules/{uuid.uuid4()}/executions",
        f"/v1/conversations/{uuid.uuid4()}/rule-executions",
    ):
        assert client.get(path).status_code == 404, path
    # and it does not show among ours
    mine = stuck_in_pending_rule(client)
    assert of_rule(client, mine) == []


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


# --- metrics -----------------------------------------------------------------------------------------------


def test_each_finished_execution_is_counted_by_outcome_and_reason(
    client: TestClient[Any], runtime: Runtime
) -> None:
    keys = [
        ("executed", "none"),
        ("skipped", "episode_moved"),
        ("skipped", "conditions_changed"),
        ("skipped", "rule_inactive"),
        ("skipped", "conversation_gone"),
        ("skipped", "expired"),
    ]
    before = {key: counted(*key) for key in keys}
    rule = stuck_in_pending_rule(client)
    doomed = create_rule(
        client, "conversation.updated", [add_label("y")], PENDING, execution_delay_minutes=240
    )
    executed = pending_since_ten(client, runtime, rule)  # both rules: one executed, one rule_inactive
    moved = pending_since_ten(client, runtime, rule)
    changed = pending_since_ten(client, runtime, rule)
    gone = pending_since_ten(client, runtime, rule)
    client.post(f"/v1/rules/{doomed}/disable")
    set_time(runtime, "2030-01-07T11:00")
    change_status(client, moved, "open")
    with runtime.pool.connection() as conn:
        # the conversation back in pending without a status change: the status re-check fails, not the episode
        conn.execute("UPDATE conversations SET status = 'open' WHERE id = %s", (uuid.UUID(changed),))
        conn.execute("DELETE FROM conversations WHERE id = %s", (uuid.UUID(gone),))
    process(runtime)
    set_time(runtime, "2030-01-07T14:00")
    swept = fire(runtime)
    assert swept.claimed == 8

    delta = {key: counted(*key) - before[key] for key in keys}
    assert delta == {
        ("executed", "none"): 1,
        ("skipped", "episode_moved"): 1,
        ("skipped", "conditions_changed"): 1,
        ("skipped", "rule_inactive"): 4,
        ("skipped", "conversation_gone"): 1,
        ("skipped", "expired"): 0,
    }
    assert labels_of(client, executed) == ["stale-pending"]

    late = pending_since_ten(client, runtime, rule)
    set_time(runtime, "2030-01-09T14:00")
    fire(runtime)
    assert counted("skipped", "expired") - before[("skipped", "expired")] == 1
    assert outcome(of_conversation(client, late)[0]) == ("skipped", "expired")


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
