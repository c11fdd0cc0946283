"""A rule's dry run (``POST /v1/rules/{id}/dry-run``): the rule evaluated now for a contact without acting:
each condition's result and the value it compared, the actions that would run, and for a delayed rule the
episode and due time the real path records for the same event; nothing it writes is kept; another project's
rule, contact or conversation is a 404.

Rules, contacts and conversations are made through the API, time is the ManualClock, and the real path is
``process_triggers`` (which records a delayed rule's pending execution).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.effects import NudgeTriggers, after_commit, pending
from libs.common.core.errors import NotFound
from libs.common.core.runtime import Runtime
from libs.common.rules.dry_run import DryRunRequest, dry_run
from tests.conftest import Project
from tests.delayed_rule_helpers import (
    PENDING,
    agent_replies,
    assert_problem,
    at,
    change_status,
    customer_writes,
    set_time,
)
from tests.factories import make_sequence
from tests.helpers import rows
from tests.rule_helpers import add_label, add_tag, create_rule, leaf, post_event, process
from tests.rule_trigger_helpers import add_tags, new_contact, new_conversation, put_settings

NINE_TO_FIVE = {"start": "09:00", "end": "17:00", "days": ["mon", "tue", "wed", "thu", "fri"]}


def run(client: TestClient[Any], rule_id: str, expected: int = 200, **body: Any) -> dict[str, Any]:
    response = client.post(f"/v1/rules/{rule_id}/dry-run", json=body)
    assert response.status_code == expected, response.text
    answer: dict[str, Any] = response.json()
    return answer


def leaves(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The evaluated leaves of a tree, by path."""
    if node["node"] == "leaf":
        return {node["path"]: node}
    return {path: found for child in node["children"] for path, found in leaves(child).items()}


def compared(node: dict[str, Any]) -> dict[str, tuple[Any, bool]]:
    """Each leaf's path: the value it compared and its result."""
    return {path: (found["actual"], found["result"]) for path, found in leaves(node).items()}


# --- what it says ------------------------------------------------------------------------------------------


def test_a_matching_and_a_non_matching_rule_show_the_values_they_compared(
    client: TestClient[Any], runtime: Runtime
) -> None:
    set_time(runtime, "2030-01-07T10:00")
    contact = new_contact(client, name="Ada", tags=["vip"], attributes={"score": 85, "plan": "gold"})
    actions = [add_tag("nurtured"), {"type": "send_webhook", "url": "https://example.com/hook"}]
    vip = create_rule(
        client,
        "contact.tag_added",
        actions,
        {
            "all": [
                leaf("event.tags_added", "contains", "VIP"),
                leaf("contact.attributes.score", "is_greater_than", 80),
                leaf("contact.name", "starts_with", "ad"),
            ]
        },
    )
    silver = create_rule(
        client,
        "contact.tag_added",
        [add_tag("silver")],
        {"all": [leaf("contact.attributes.plan", "equal_to", "silver"), leaf("contact.tags", "is_present")]},
    )

    matched = run(client, vip, contact_id=contact, event={"tags_added": ["vip"]})
    assert (matched["rule_id"], matched["event"], matched["contact_id"]) == (
        vip,
        "contact.tag_added",
        contact,
    )
    assert matched["matched"] is True and matched["conversation_id"] is None
    assert matched["conditions"] | {"children": None} == {
        "node": "group",
        "path": "conditions",
        "kind": "all",
        "result": True,
        "children": None,
    }
    assert matched["conditions"]["children"][0] == {
        "node": "leaf",
        "path": "conditions.all.0",
        "attribute": "event.tags_added",
        "operator": "contains",
        "value": "VIP",
        "actual": ["vip"],
        "result": True,
    }
    assert compared(matched["conditions"]) == {
        "conditions.all.0": (["vip"], True),
        "conditions.all.1": (85, True),
        "conditions.all.2": ("Ada", True),
    }
    assert matched["actions"] == [
        {"type": "add_contact_tag", "tags": ["nurtured"]},
        {"type": "send_webhook", "url": "https://example.com/hook"},
    ]
    assert matched["delayed"] is None
    assert datetime.fromisoformat(matched["evaluated_at"]) == at("2030-01-07T10:00")

    # the same rule without the event's tag, and a rule whose plan does not match: values shown all the same
    missed = run(client, vip, contact_id=contact)
    assert missed["matched"] is False and missed["actions"] == []
    assert compared(missed["conditions"])["conditions.all.0"] == ([], False)
    other = run(client, silver, contact_id=contact, event={"tags_added": ["vip"]})
    assert other["matched"] is False and other["actions"] == []
    assert compared(other["conditions"]) == {
        "conditions.all.0": ("gold", False),
        "conditions.all.1": (["vip"], True),
    }


def test_nested_all_and_any_groups_each_show_their_result(client: TestClient[Any], runtime: Runtime) -> None:
    contact = new_contact(client, attributes={"score": 40})
    conversation = new_conversation(client, contact)
    post_event(
        client, {"type": "conversation.updated", "conversation_id": conversation, "labels": ["billing"]}
    )
    rule = create_rule(
        client,
        "message.created",
        [add_label("pricing")],
        {
            "all": [
                leaf("message.type", "equal_to", "incoming"),
                {
                    "any": [
                        leaf("message.content", "contains", "price"),
                        leaf("contact.attributes.score", "is_greater_than", 90),
                        {
                            "all": [
                                leaf("conversation.status", "equal_to", "open"),
                                leaf("conversation.labels", "contains", "billing"),
                            ]
                        },
                    ]
                },
                {"any": [leaf("contact.phone", "is_not_present"), leaf("lead.status", "in", ["won"])]},
            ]
        },
    )
    body: dict[str, Any] = {
        "contact_id": contact,
        "event": {"message": {"type": "incoming", "content": "How much?"}},
    }
    answer = run(client, rule, **body)  # no conversation named: the contact's open one
    assert answer["conversation_id"] == conversation

    def results(node: dict[str, Any]) -> dict[str, bool]:
        found = {node["path"]: node["result"]}
        for child in node.get("children", []):
            found |= results(child)
        return found

    assert results(answer["conditions"]) == {
        "conditions": False,
        "conditions.all.0": True,
        "conditions.all.1": True,
        "conditions.all.1.any.0": False,
        "conditions.all.1.any.1": False,
        "conditions.all.1.any.2": True,
        "conditions.all.1.any.2.all.0": True,
        "conditions.all.1.any.2.all.1": True,
        "conditions.all.2": False,  # the contact has a phone and no lead
        "conditions.all.2.any.0": False,
        "conditions.all.2.any.1": False,
    }
    assert compared(answer["conditions"])["conditions.all.1.any.0"] == ("How much?", False)
    assert compared(answer["conditions"])["conditions.all.2.any.1"] == (None, False)  # absent
    assert answer["matched"] is False and answer["actions"] == []

    asked = run(client, rule, **(body | {"event": {"message": {"type": "incoming", "content": "PRICE?"}}}))
    assert asked["matched"] is False  # the last group still fails
    post_event(
        client, {"type": "lead.created", "contact_id": contact, "lead_id": str(uuid.uuid4()), "status": "won"}
    )
    won = run(client, rule, **body)
    assert won["matched"] is True and won["actions"] == [add_label("pricing")]
    assert compared(won["conditions"])["conditions.all.2.any.1"] == ("won", True)


def test_a_rule_without_conditions_always_matches_and_an_inactive_rule_is_evaluated_too(
    client: TestClient[Any],
) -> None:
    contact = new_contact(client)
    rule = create_rule(client, "contact.created", [add_tag("welcomed")], active=False)
    answer = run(client, rule, contact_id=contact)
    assert answer["conditions"] == {
        "node": "group",
        "path": "conditions",
        "kind": "all",
        "result": True,
        "children": [],
    }
    assert answer["matched"] is True and answer["actions"] == [add_tag("welcomed")]
    single = create_rule(client, "contact.created", [add_tag("x")], leaf("contact.tags", "is_not_present"))
    assert run(client, single, contact_id=contact)["conditions"] == {
        "node": "leaf",
        "path": "conditions",
        "attribute": "contact.tags",
        "operator": "is_not_present",
        "value": None,
        "actual": [],
        "result": True,
    }


# --- a delayed rule: the episode and due time the real path records -----------------------------------------


def executions_of(runtime: Runtime, rule_id: str) -> list[tuple[str, str, datetime]]:
    return [
        (kind, key, due)
        for kind, key, due in rows(
            runtime.pool,
            "SELECT episode_kind, episode_key, due_at FROM rule_pending_executions WHERE rule_id = %s",
            uuid.UUID(rule_id),
        )
    ]


def test_a_status_episode_and_due_time_equal_what_the_real_path_records(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given a rule "4 hours in pending" and a conversation that went pending at 10:00
    rule = create_rule(
        client, "conversation.updated", [add_label("stale")], PENDING, execution_delay_minutes=240
    )
    contact = new_contact(client)
    set_time(runtime, "2030-01-07T09:00")
    conversation = new_conversation(client, contact)
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")  # its trigger is recorded, not yet processed

    # When the same event is tried, then processed for real
    went_pending = {"changed": {"conversation.status": {"from": "open", "to": "pending"}}}
    tried = run(client, rule, contact_id=contact, conversation_id=conversation, event=went_pending)
    process(runtime)

    # Then the dry run's episode and due time are the ones recorded
    delayed = tried["delayed"]
    assert tried["matched"] is True and tried["actions"] == [add_label("stale")]
    assert (delayed["episode_kind"], delayed["episode_key"]) == ("status", "status:2030-01-07T10:00:00+00:00")
    assert executions_of(runtime, rule) == [
        (delayed["episode_kind"], delayed["episode_key"], datetime.fromisoformat(delayed["due_at"]))
    ]
    assert datetime.fromisoformat(delayed["due_at"]) == at("2030-01-07T14:00")

    # a later event of the same episode (a note at 11:00) does not reset the clock, tried or real
    set_time(runtime, "2030-01-07T11:00")
    note = {"changed": {"conversation.private_note": {"from": None, "to": "called"}}}
    later = run(client, rule, contact_id=contact, conversation_id=conversation, event=note)["delayed"]
    post_event(
        client, {"type": "conversation.updated", "conversation_id": conversation, "private_note": "called"}
    )
    process(runtime)
    assert executions_of(runtime, rule) == [
        (later["episode_kind"], later["episode_key"], datetime.fromisoformat(later["due_at"]))
    ]


def test_an_awaiting_agent_and_a_reply_chase_episode_equal_what_the_real_path_records(
    client: TestClient[Any], runtime: Runtime
) -> None:
    unanswered = create_rule(
        client,
        "message.created",
        [add_label("unanswered")],
        leaf("message.type", "equal_to", "incoming"),
        execution_delay_minutes=60,
    )
    chase = create_rule(
        client,
        "message.created",
        [add_label("chase")],
        leaf("message.type", "equal_to", "outgoing"),
        execution_delay_minutes=1440,
    )
    contact = new_contact(client)
    set_time(runtime, "2030-01-07T10:00")
    conversation = customer_writes(client, contact)  # recorded with the anchors of 10:00, not yet processed
    set_time(runtime, "2030-01-07T10:20")
    incoming = {"message": {"type": "incoming", "content": "hello"}}
    awaiting = run(client, unanswered, contact_id=contact, conversation_id=conversation, event=incoming)[
        "delayed"
    ]
    assert (
        run(client, chase, contact_id=contact, conversation_id=conversation, event=incoming)["delayed"]
        is None
    )
    process(runtime)
    assert executions_of(runtime, unanswered) == [
        (awaiting["episode_kind"], awaiting["episode_key"], datetime.fromisoformat(awaiting["due_at"]))
    ]
    assert awaiting["episode_kind"] == "awaiting_agent" and awaiting["due_at"].startswith("2030-01-07T11:00")

    set_time(runtime, "2030-01-07T12:00")
    agent_replies(client, conversation)
    outgoing = {"message": {"type": "outgoing", "content": "Try this"}}
    chased = run(client, chase, contact_id=contact, conversation_id=conversation, event=outgoing)["delayed"]
    process(runtime)
    assert executions_of(runtime, chase) == [
        (chased["episode_kind"], chased["episode_key"], datetime.fromisoformat(chased["due_at"]))
    ]
    assert chased["episode_kind"] == "reply_chase" and chased["due_at"].startswith("2030-01-08T12:00")


def test_an_event_episode_in_business_hours_is_due_when_the_real_path_says(
    client: TestClient[Any], runtime: Runtime
) -> None:
    put_settings(client, business_hours=NINE_TO_FIVE)
    rule = create_rule(
        client,
        "contact.tag_added",
        [add_tag("nudged")],
        leaf("event.tags_added", "contains", "trial"),
        execution_delay_minutes=240,
        delay_in_business_hours=True,
    )
    contact = new_contact(client)
    set_time(runtime, "2030-01-04T16:00")  # a Friday: one hour on Friday, three on Monday
    answer = run(client, rule, contact_id=contact, event={"tags_added": ["trial"]})
    add_tags(client, contact, "trial")
    process(runtime)
    # an event is an episode of its own, keyed by its trigger: the dry run keeps none, so it names no key
    delayed = answer["delayed"]
    assert (delayed["episode_kind"], delayed["episode_key"]) == ("event", None)
    assert datetime.fromisoformat(delayed["due_at"]) == at("2030-01-07T12:00")
    [(kind, key, due)] = executions_of(runtime, rule)
    assert (kind, due) == ("event", at("2030-01-07T12:00")) and key.startswith("event:")


# --- nothing written ---------------------------------------------------------------------------------------

#: What a rule's actions and its triggers would change.
WRITTEN = {
    "followup_triggers": "SELECT count(*) FROM followup_triggers",
    "rule_runs": "SELECT count(*) FROM rule_runs",
    "rule_pending_executions": "SELECT count(*) FROM rule_pending_executions",
    "messages": "SELECT count(*) FROM messages",
    "webhook_deliveries": "SELECT count(*) FROM webhook_deliveries",
    "followup_enrollments": "SELECT count(*) FROM followup_enrollments",
    "outbox": "SELECT count(*) FROM outbox",
    "tags": "SELECT coalesce(array_agg(t ORDER BY t), '{}') FROM contacts, unnest(tags) t",
    "labels": "SELECT coalesce(array_agg(l ORDER BY l), '{}') FROM conversations, unnest(labels) l",
    "statuses": "SELECT array_agg(status ORDER BY id) FROM conversations",
}


def snapshot(runtime: Runtime) -> dict[str, Any]:
    return {name: rows(runtime.pool, query)[0][0] for name, query in WRITTEN.items()}


def test_nothing_it_writes_is_kept(client: TestClient[Any], runtime: Runtime, project: Project) -> None:
    sequence = make_sequence(runtime.pool, project.id)
    actions = [
        add_tag("tagged"),
        add_label("labelled"),
        {"type": "change_status", "status": "resolved"},
        {"type": "send_message", "text": "Hello"},
        {"type": "send_webhook", "url": "https://example.com/hook"},
        {"type": "enroll_in_sequence", "sequence_id": str(sequence)},
    ]
    at_once = create_rule(client, "message.created", actions)
    later = create_rule(client, "message.created", actions, execution_delay_minutes=30)
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    process(runtime)
    before = snapshot(runtime)
    incoming = {"message": {"type": "incoming", "content": "hi"}}
    for rule in (at_once, later):
        answer = run(client, rule, contact_id=contact, conversation_id=conversation, event=incoming)
        assert answer["matched"] is True and len(answer["actions"]) == len(actions)
    assert snapshot(runtime) == before
    assert process(runtime) == 0  # no trigger was left to the triggers service


def test_the_dry_run_rolls_back_inside_the_callers_transaction(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    contact = new_contact(client)
    rule = create_rule(client, "contact.created", [add_tag("x")])
    with runtime.pool.connection() as conn, conn.transaction(force_rollback=True):
        after_commit(conn, NudgeTriggers(project.id))  # the caller's own effect is kept
        answer = dry_run(
            conn,
            project.id,
            uuid.UUID(rule),
            DryRunRequest(contact_id=uuid.UUID(contact)),
            now=runtime.clock.now(),
        )
        assert answer.matched
        assert conn.execute("SELECT count(*) FROM followup_triggers").fetchone() == (0,)
        assert pending(conn) == [NudgeTriggers(project.id)]
        conn.execute("SELECT 1")  # the caller's transaction is still usable
        with pytest.raises(NotFound):
            dry_run(
                conn,
                project.id,
                uuid.uuid4(),
                DryRunRequest(contact_id=uuid.UUID(contact)),
                now=runtime.clock.now(),
            )


# --- refusals ----------------------------------------------------------------------------------------------


@contextmanager
def as_project(client: TestClient[Any], project: Project) -> Iterator[TestClient[Any]]:
    """``client`` authenticated as ``project`` for as long as the block runs."""
    kept = client.headers["Authorization"]
    client.headers.update(project.headers)
    try:
        yield client
    finally:
        client.headers["Authorization"] = kept


def test_another_projects_rule_contact_or_conversation_is_a_404(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    rule = create_rule(client, "message.created", [add_label("x")])
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    with as_project(client, other_project) as other:
        their_rule = create_rule(other, "message.created", [add_label("x")])
        their_contact = new_contact(other)
        their_conversation = new_conversation(other, their_contact)
        refused = other.post(f"/v1/rules/{rule}/dry-run", json={"contact_id": their_contact})
        assert_problem(refused, 404, "rule_id")
    ours = {"contact_id": contact, "conversation_id": conversation}
    cases = [
        (their_rule, ours, "rule_id"),
        (str(uuid.uuid4()), ours, "rule_id"),
        (rule, {"contact_id": their_contact}, "contact_id"),
        (rule, {"contact_id": str(uuid.uuid4())}, "contact_id"),
        (rule, {"contact_id": contact, "conversation_id": their_conversation}, "conversation_id"),
        (rule, {"contact_id": new_contact(client), "conversation_id": conversation}, "conversation_id"),
    ]
    for rule_id, body, field in cases:
        assert_problem(client.post(f"/v1/rules/{rule_id}/dry-run", json=body), 404, field)
    assert snapshot(runtime)["followup_triggers"] == 0


def test_a_body_an_event_of_the_rules_type_cannot_have_is_refused_naming_the_field(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    on_tag = create_rule(client, "contact.tag_added", [add_tag("x")])
    on_message = create_rule(client, "message.created", [add_label("x")])
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    refused = [
        (on_tag, {"contact_id": contact, "conversation_id": conversation}, 422, "conversation_id"),
        (on_message, {"contact_id": new_contact(client)}, 422, "conversation_id"),  # no open conversation
        (on_tag, {"contact_id": contact, "event": {"tags_added": ["a\x00b"]}}, 422, "event.tags_added.0"),
        (on_tag, {"contact_id": contact, "event": {"tag": "vip"}}, 400, "event.tag"),
        (on_tag, {"contact_id": contact, "event": {"tags_added": ["x" * 65]}}, 422, "event.tags_added.0"),
        (
            on_message,
            {"contact_id": contact, "event": {"message": {"type": "note"}}},
            422,
            "event.message.type",
        ),
        (on_tag, {"contact_id": contact, "extra": 1}, 400, "extra"),
    ]
    for rule_id, body, status, field in refused:
        assert_problem(client.post(f"/v1/rules/{rule_id}/dry-run", json=body), status, field)
    change_status(client, conversation, "resolved")
    resolved = run(client, on_message, contact_id=contact, conversation_id=conversation)
    assert resolved["conversation_id"] == conversation  # a conversation named is used whatever its status


def test_a_read_key_may_not_dry_run(client: TestClient[Any]) -> None:
    rule = create_rule(client, "contact.created", [add_tag("x")])
    contact = new_contact(client)
    created = client.post("/v1/api-keys", json={"name": "reader", "scope": "read"}).json()
    response = client.post(
        f"/v1/rules/{rule}/dry-run",
        json={"contact_id": contact},
        headers={"Authorization": f"Bearer {created['api_key']}"},
    )
    body = assert_problem(response, 403, "scope")
    assert "it needs the `write` scope" in body["detail"]
