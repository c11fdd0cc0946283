"""What a delayed rule's executions show (seed 002): the executions endpoints (pages, status filter,
404s, projects kept apart) and the ``whatstig_rule_executions_total`` counter.

Rules created through the API, events caused through ``POST /v1/events``, time driven by the ManualClock,
triggers processed with ``process_triggers`` (which records the pending executions of delayed rules) and
due executions fired with ``sweep``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from tests.conftest import Project
from tests.delayed_rule_helpers import (
    PENDING,
    assert_problem,
    change_status,
    counted,
    executions_page,
    fire,
    labels_of,
    new_conversation,
    of_conversation,
    of_rule,
    outcome,
    pending_since_ten,
    set_time,
    stuck_in_pending_rule,
)
from tests.factories import new_phone
from tests.rule_helpers import add_label, create_rule, process

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
