"""The ids a project sees tell it nothing of other projects' volume: a trigger is recorded under a bigint of
one global sequence (the internal key), but what the project is shown, in an event's answer, a rule's runs,
a webhook delivery and the webhook's body, is the trigger's random public id."""

from __future__ import annotations

import uuid
from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from tests.bulk_helpers import as_project
from tests.conftest import Project
from tests.delayed_rule_helpers import PENDING, change_status, fire, new_conversation, set_time
from tests.helpers import rows
from tests.rule_helpers import create_rule, post_event, process
from tests.rule_trigger_helpers import new_contact

HOOK = [{"type": "send_webhook", "url": "http://example.invalid/hook"}]


def _lead(client: TestClient[Any]) -> list[str]:
    """A lead created for a new contact; the trigger ids its answer shows."""
    answer = post_event(client, {"type": "lead.created", "contact_id": new_contact(client)}, 201)
    ids: list[str] = answer["trigger_ids"]
    return ids


def _random_uuid(value: Any) -> uuid.UUID:
    assert isinstance(value, str), value  # never a number
    parsed = uuid.UUID(value)
    assert parsed.version == 4, value
    return parsed


def test_a_projects_trigger_ids_do_not_grow_with_another_projects_volume(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    # Given project A and project B, each with a rule that posts a webhook on lead.created
    rule = create_rule(client, "lead.created", HOOK)
    with as_project(client, other_project) as other:
        create_rule(other, "lead.created", HOOK)

    # When A records a trigger, B records 25, and A records another
    [first] = _lead(client)
    with as_project(client, other_project) as other:
        for _ in range(25):
            _lead(other)
    [second] = _lead(client)
    assert process(runtime) == 27

    # Then the two ids A was shown are random uuids, not numbers that B's volume moved on
    shown = {_random_uuid(first), _random_uuid(second)}
    assert len(shown) == 2
    internal = rows(
        runtime.pool,
        "SELECT id, public_id FROM followup_triggers WHERE project_id = %s ORDER BY id",
        project.id,
    )
    assert [public for _, public in internal] == [uuid.UUID(first), uuid.UUID(second)]
    (one, _), (two, _) = internal
    assert two - one == 26  # the internal key did count B's triggers: it is never shown
    # and every other place A sees a trigger names it by the same public id
    ran = client.get(f"/v1/rules/{rule}/runs").json()["items"]
    assert {_random_uuid(run["trigger_id"]) for run in ran} == shown
    deliveries = client.get("/v1/webhook-deliveries").json()["items"]
    assert {_random_uuid(d["trigger_id"]) for d in deliveries} == shown
    assert {_random_uuid(d["payload"]["trigger_id"]) for d in deliveries} == shown
    # and no field of what A reads holds a number of the internal sequence
    assert not {one, two} & _numbers([ran, deliveries])


def _numbers(value: Any) -> set[int]:
    """Every integer in a JSON value, however deep."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return set().union(*(_numbers(v) for v in value)) if value else set()
    return set()


def test_a_delayed_rules_webhook_names_its_trigger_by_the_public_id(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    # Given a rule that posts a webhook 4 hours after a conversation went Pending
    set_time(runtime, "2030-01-07T09:00")
    rule = create_rule(client, "conversation.updated", HOOK, PENDING, execution_delay_minutes=240)
    conversation = new_conversation(client)
    set_time(runtime, "2030-01-07T10:00")
    change_status(client, conversation, "pending")
    process(runtime)

    # When its time comes
    set_time(runtime, "2030-01-07T14:00")
    assert fire(runtime).claimed == 1

    # Then the delivery and its body name the trigger that opened the episode by its public id
    [(public,)] = rows(
        runtime.pool,
        "SELECT t.public_id FROM rule_pending_executions e JOIN followup_triggers t ON t.id = e.trigger_id"
        " WHERE e.project_id = %s AND e.rule_id = %s",
        project.id,
        uuid.UUID(rule),
    )
    [delivery] = client.get("/v1/webhook-deliveries").json()["items"]
    assert _random_uuid(delivery["trigger_id"]) == public
    assert _random_uuid(delivery["payload"]["trigger_id"]) == public
