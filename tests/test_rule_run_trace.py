"""A rule run's decision trace (``GET /v1/rules/{id}/runs/{run_id}``, and the short form of the runs list):
the conditions as the triggers service evaluated them (each result, each value compared), a delayed rule's
episode, and its execution with the conditions as re-checked when it fell due and the guard that stopped it.
Another project's run is a 404; the traces go with their rows (retention).

Rules, contacts and events through the API, the triggers service and the sweep as they run, time on the
ManualClock.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from libs.common.retention.cleanup import run_retention
from libs.common.rules import trace
from services.release.release import release_batch
from tests.bulk_helpers import as_project
from tests.conftest import Project
from tests.delayed_rule_helpers import (
    PENDING,
    assert_problem,
    at,
    change_status,
    fire,
    pending_since_ten,
    set_time,
    stuck_in_pending_rule,
)
from tests.delayed_rule_helpers import new_conversation as conversation_of_new_contact
from tests.rule_helpers import add_label, add_tag, create_rule, leaf, post_event, process
from tests.rule_trigger_helpers import add_tags, new_contact, put_settings

#: Tagged vip, and a gold plan or a demo tag.
VIP_GOLD_OR_DEMO = {
    "all": [
        leaf("contact.tags", "contains", "vip"),
        {
            "any": [
                leaf("contact.attributes.plan", "equal_to", "gold"),
                leaf("contact.tags", "contains", "demo"),
            ]
        },
    ]
}


def runs_of(client: TestClient[Any], rule_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/rules/{rule_id}/runs")
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def run_of(client: TestClient[Any], rule_id: str, run_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/rules/{rule_id}/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def compared(node: dict[str, Any]) -> dict[str, tuple[Any, bool]]:
    """Each node's path: a leaf's value compared and result, a group's result."""
    if node["node"] == "leaf":
        return {node["path"]: (node["actual"], node["result"])}
    found = {node["path"]: (node["kind"], node["result"])}
    for child in node["children"]:
        found |= compared(child)
    return found


@pytest.fixture(params=["in its matching", "read apart"])
def traced_where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the triggers service reads a rule's trace: in the rule's matching column (a rule of at most
    ``TRACED_NODES`` nodes), or apart (a bigger rule: every rule here, under a bound of 0)."""
    if request.param == "read apart":
        monkeypatch.setattr(trace, "TRACED_NODES", 0)
    return str(request.param)


def test_an_immediate_run_keeps_which_conditions_held_with_the_values_compared(
    client: TestClient[Any], runtime: Runtime, traced_where: str
) -> None:
    # Given a rule "vip, and gold or demo" and a vip contact on the gold plan
    rule = create_rule(client, "contact.tag_added", [add_tag("nurtured")], VIP_GOLD_OR_DEMO)
    contact = new_contact(client, attributes={"plan": "gold"})

    # When the contact is tagged vip and the triggers service runs the rule
    add_tags(client, contact, "vip")
    process(runtime)

    # Then the run says what held and what did not, with the values compared then
    [listed] = runs_of(client, rule)
    assert listed["outcome"] == "executed"
    assert listed["conditions_summary"] == '2/3 held: contact.tags = ["vip"] does not contain "demo"'
    run = run_of(client, rule, listed["trigger_id"])
    assert (run["trigger_id"], run["event"], run["contact_id"]) == (
        listed["trigger_id"],
        "contact.tag_added",
        contact,
    )
    assert compared(run["conditions"]) == {
        "conditions": ("all", True),
        "conditions.all.0": (["vip"], True),
        "conditions.all.1": ("any", True),
        "conditions.all.1.any.0": ("gold", True),
        "conditions.all.1.any.1": (["vip"], False),
    }
    assert run["conditions_summary"] == listed["conditions_summary"]
    assert (run["delayed"], run["execution"]) == (None, None)

    # and the trace is the values of that moment: a later change of the contact does not rewrite it
    add_tags(client, contact, "demo")
    process(runtime)
    assert compared(run_of(client, rule, listed["trigger_id"])["conditions"])["conditions.all.0"] == (
        ["vip"],
        True,
    )
    newest = runs_of(client, rule)[0]
    assert newest["conditions_summary"] == "all 3 conditions held"


def test_a_rejected_run_keeps_its_trace_and_its_reason(client: TestClient[Any], runtime: Runtime) -> None:
    # Given a rule that sends a message to a contact who opted out
    rule = create_rule(
        client,
        "contact.tag_added",
        [{"type": "send_message", "text": "hi"}],
        {"all": [leaf("event.tags_added", "contains", "vip")]},
    )
    contact = new_contact(client)
    post_event(client, {"type": "contact.opted_out", "contact_id": contact})

    # When the rule runs
    add_tags(client, contact, "vip")
    process(runtime)

    # Then it was refused, and its trace says its conditions held
    [listed] = runs_of(client, rule)
    run = run_of(client, rule, listed["trigger_id"])
    assert (run["outcome"], run["reason"]) == ("rejected", "opted_out")
    assert compared(run["conditions"]) == {"conditions": ("all", True), "conditions.all.0": (["vip"], True)}


def test_a_delayed_run_keeps_its_episode_and_its_execution_the_conditions_rechecked_when_due(
    client: TestClient[Any], runtime: Runtime, traced_where: str
) -> None:
    # Given the 4-hour "stuck in pending" rule and a conversation that went pending at 10:00
    rule = stuck_in_pending_rule(client)
    pending_since_ten(client, runtime, rule)

    # Then its run was scheduled in the status episode, due 14:00, its conditions held then
    [listed] = runs_of(client, rule)
    run = run_of(client, rule, listed["trigger_id"])
    assert run["outcome"] == "scheduled"
    assert run["delayed"]["episode_kind"] == "status"
    assert run["delayed"]["episode_key"].startswith("status:2030-01-07T10:00")
    assert at(run["delayed"]["due_at"].removesuffix("Z")) == at("2030-01-07T14:00")
    assert compared(run["conditions"]) == {"conditions": ("pending", True)}  # one condition: the root
    execution = run["execution"]
    assert (execution["status"], execution["conditions"], execution["skip_reason"]) == ("pending", None, None)

    # When the rule is edited to want an open conversation, and the execution falls due
    response = client.patch(
        f"/v1/rules/{rule}", json={"conditions": {"all": [leaf("conversation.status", "equal_to", "open")]}}
    )
    assert response.status_code == 200, response.text
    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)

    # Then the execution says which guard stopped it, with the conditions as re-checked then
    execution = run_of(client, rule, listed["trigger_id"])["execution"]
    assert (execution["status"], execution["skip_reason"]) == ("skipped", "conditions_changed")
    assert compared(execution["conditions"]) == {
        "conditions": ("all", False),
        "conditions.all.0": ("pending", False),
    }
    # and the run's own trace is still what held when it was scheduled
    assert compared(run_of(client, rule, listed["trigger_id"])["conditions"]) == {
        "conditions": ("pending", True)
    }


def test_an_executed_delayed_run_keeps_the_conditions_that_held_when_it_fell_due(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T09:00")
    rule = create_rule(
        client, "conversation.updated", [add_label("stale")], PENDING, execution_delay_minutes=60
    )
    conversation = conversation_of_new_contact(client)
    change_status(client, conversation, "pending")
    process(runtime)
    set_time(runtime, "2030-01-07T10:00")
    fire(runtime)

    [listed] = runs_of(client, rule)
    execution = run_of(client, rule, listed["trigger_id"])["execution"]
    assert (execution["status"], execution["skip_reason"]) == ("executed", None)
    assert compared(execution["conditions"]) == {"conditions": ("pending", True)}


def test_another_projects_run_or_another_rules_is_a_404_with_problem_details(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    rule = create_rule(client, "contact.tag_added", [add_tag("seen")])
    other_rule = create_rule(
        client, "contact.tag_added", [add_tag("other")], {"all": [leaf("contact.tags", "contains", "x")]}
    )
    contact = new_contact(client)
    add_tags(client, contact, "vip")
    process(runtime)
    [listed] = runs_of(client, rule)
    run_id = listed["trigger_id"]

    with as_project(client, other_project) as other:
        their_rule = create_rule(other, "contact.tag_added", [add_tag("seen")])
        assert_problem(other.get(f"/v1/rules/{rule}/runs/{run_id}"), 404, "rule_id")
        assert_problem(other.get(f"/v1/rules/{their_rule}/runs/{run_id}"), 404, "run_id")
    assert_problem(client.get(f"/v1/rules/{other_rule}/runs/{run_id}"), 404, "run_id")  # it did not run
    assert_problem(client.get(f"/v1/rules/{rule}/runs/{uuid.uuid4()}"), 404, "run_id")
    assert client.get(f"/v1/rules/{rule}/runs/not-a-uuid").status_code in (400, 404)


def test_retention_takes_the_runs_and_the_executions_with_their_traces(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given an immediate run and a delayed rule's execution that ran
    set_time(runtime, "2030-01-07T09:00")
    immediate = create_rule(client, "contact.tag_added", [add_tag("seen")], VIP_GOLD_OR_DEMO)
    add_tags(client, new_contact(client, attributes={"plan": "gold"}), "vip")
    delayed = create_rule(
        client, "conversation.updated", [add_label("stale")], PENDING, execution_delay_minutes=60
    )
    change_status(client, conversation_of_new_contact(client), "pending")
    process(runtime)
    set_time(runtime, "2030-01-07T10:00")
    fire(runtime)
    [now_run] = runs_of(client, immediate)
    [later_run] = runs_of(client, delayed)
    assert run_of(client, delayed, later_run["trigger_id"])["execution"]["conditions"] is not None

    # When 8 days have passed: the triggers (and their runs, with their traces) are past their 7 days
    set_time(runtime, "2030-01-15T10:00")
    assert run_retention(runtime.pool, runtime.clock.now) is True

    # Then both runs went with their triggers, and their traces with them (nothing pending holds the
    # delayed one's trigger: its execution ran)
    assert_problem(client.get(f"/v1/rules/{immediate}/runs/{now_run['trigger_id']}"), 404, "run_id")
    assert_problem(client.get(f"/v1/rules/{delayed}/runs/{later_run['trigger_id']}"), 404, "run_id")
    # and the execution, with its trace, goes after its 30 days
    assert _traced_executions(runtime) == 1
    set_time(runtime, "2030-02-10T10:00")
    assert run_retention(runtime.pool, runtime.clock.now) is True
    assert _traced_executions(runtime) == 0


def _traced_executions(runtime: Runtime) -> int:
    with runtime.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM rule_pending_executions WHERE trace IS NOT NULL").fetchone()
    assert row is not None
    return int(row[0])


def test_an_erased_contact_leaves_no_values_in_any_trace(client: TestClient[Any], runtime: Runtime) -> None:
    # Given a delayed rule that ran for a contact (its execution's trace holds the contact's plan), and a
    # follow-up of the contact skipped for want of consent (its step run holds the contact's consent)
    set_time(runtime, "2030-01-07T09:00")
    rule = create_rule(
        client, "contact.tag_added", [add_tag("seen")], VIP_GOLD_OR_DEMO, execution_delay_minutes=60
    )
    contact = new_contact(client, attributes={"plan": "gold"})
    add_tags(client, contact, "vip")
    process(runtime)
    set_time(runtime, "2030-01-07T10:00")
    fire(runtime)
    [listed] = runs_of(client, rule)
    assert run_of(client, rule, listed["trigger_id"])["execution"]["conditions"] is not None
    put_settings(client, consent_mode="required")
    sequence = client.post(
        "/v1/sequences", json={"name": "s", "definition": {"steps": [{"kind": "message", "text": "hi"}]}}
    )
    assert client.post(f"/v1/sequences/{sequence.json()['id']}/publish").status_code == 201
    enrolled = client.post(
        "/v1/enrollments", json={"sequence_id": sequence.json()["id"], "contact_id": contact}
    )
    release_batch(runtime.pool, runtime.clock, runtime.settings.followup)
    assert _kept_values(runtime) == (1, 1)

    # When the contact is erased
    post_event(client, {"type": "contact.erased", "contact_id": contact})

    # Then its runs went with its triggers, and what the execution and the step run kept is forgotten
    assert_problem(client.get(f"/v1/rules/{rule}/runs/{listed['trigger_id']}"), 404, "run_id")
    assert _kept_values(runtime) == (0, 0)
    detail = client.get(f"/v1/enrollments/{enrolled.json()['id']}").json()
    assert [run["reason_values"] for run in detail["step_runs"]] == [None]


def _kept_values(runtime: Runtime) -> tuple[int, int]:
    """How many executions keep a trace, and how many step runs keep values."""
    with runtime.pool.connection() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM rule_pending_executions WHERE trace IS NOT NULL),"
            " (SELECT count(*) FROM followup_step_runs WHERE reason_values IS NOT NULL)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
