"""Rules over the REST API: create, read, list (cursor pages in run order, filters), update, reorder,
enable / disable, delete and runs; every event and action type; validation answered as problem details
that name the field (and save nothing); other projects' rules; the per-process rule cache; the schema.

Field paths in problem details are dotted, list indexes included: ``conditions.all.0.operator``,
``actions.1.tags.0``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast, get_args

import pytest
from litestar.testing import TestClient
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.platform.conditions import MAX_DEPTH, Event, Group, Leaf
from libs.common.rules.actions import Action
from libs.common.rules.rules import MAX_DELAY_MINUTES, RULES, ActiveRule, runs_after
from tests.conftest import Project
from tests.factories import make_sequence
from tests.test_api_sequences import assert_problem, count, one

#: Every event a rule may fire on, and every action type of the union.
EVENTS: list[str] = list(get_args(Event))
ACTION_TYPES: list[str] = [cast(str, kind.__struct_config__.tag) for kind in get_args(Action)]

LABEL = {"type": "add_label", "labels": ["vip"]}
#: Stands for a published sequence of the caller's project in an ``enroll_in_sequence`` action.
SEQUENCE = "<sequence>"

#: A valid action of every type (each with its optional fields set where it has some).
VALID_ACTIONS: dict[str, dict[str, Any]] = {
    "enroll_in_sequence": {
        "type": "enroll_in_sequence",
        "sequence_id": SEQUENCE,
        "anchor": "contact.attributes.appointment_at",
        "variables": {"product": "boots"},
    },
    "send_message": {
        "type": "send_message",
        "text": 'Hi {{contact.name | "there"}}, about {{vars.event_type}}',
        "whatsapp_template": {
            "name": "welcome_back",
            "language": "pt_BR",
            "parameters": ['{{contact.name | "there"}}'],
        },
    },
    "add_label": {"type": "add_label", "labels": ["vip", "billing"]},
    "remove_label": {"type": "remove_label", "labels": ["cold"]},
    "add_contact_tag": {"type": "add_contact_tag", "tags": ["customer", "plan:pro"]},
    "remove_contact_tag": {"type": "remove_contact_tag", "tags": ["lead"]},
    "assign_agent": {"type": "assign_agent", "assignee": "ana@example.com"},
    "assign_team": {"type": "assign_team", "team": "support"},
    "change_status": {"type": "change_status", "status": "resolved"},
    "change_priority": {"type": "change_priority", "priority": "urgent"},
    "snooze_until": {"type": "snooze_until", "minutes": 90},
    "add_private_note": {"type": "add_private_note", "text": "Rule fired for {{contact.name}}"},
    "send_webhook": {"type": "send_webhook", "url": "https://hooks.example.com/rules?x=1"},
}


def leaf(attribute: str, operator: str, *value: Any) -> dict[str, Any]:
    """A condition tree of one leaf (``value`` left out when none is given)."""
    return {"all": [{"attribute": attribute, "operator": operator} | ({"value": value[0]} if value else {})]}


def nest(node: dict[str, Any], groups: int) -> dict[str, Any]:
    """``node`` inside ``groups`` nested ``all`` groups."""
    for _ in range(groups):
        node = {"all": [node]}
    return node


NAME_IS_ANA = leaf("contact.name", "equal_to", "Ana")


def rule_body(**fields: Any) -> dict[str, Any]:
    return {"name": "welcome", "event": "contact.created", "actions": [LABEL]} | fields


def new_rule(client: TestClient[Any], headers: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    response = client.post("/v1/rules", json=rule_body(**fields), headers=headers)
    assert response.status_code == 201, response.text
    rule: dict[str, Any] = response.json()
    return rule


def with_sequence(action: dict[str, Any], sequence_id: uuid.UUID) -> dict[str, Any]:
    return {k: str(sequence_id) if v == SEQUENCE else v for k, v in action.items()}


def listed(client: TestClient[Any], **params: Any) -> dict[str, Any]:
    response = client.get("/v1/rules", params=params)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def listed_ids(client: TestClient[Any], **params: Any) -> list[str]:
    """The ids of every rule listed (one page of up to 500)."""
    page = listed(client, limit=500, **params)
    assert page["next"] is None
    return [item["id"] for item in page["items"]]


def every_page(client: TestClient[Any], limit: int, **params: Any) -> list[list[str]]:
    """The ids of each page, following ``next`` until there is none."""
    pages: list[list[str]] = []
    after: str | None = None
    for _ in range(50):
        page = listed(client, limit=limit, **params, **({"after": after} if after else {}))
        assert len(page["items"]) <= limit
        pages.append([item["id"] for item in page["items"]])
        after = page["next"]
        if after is None:
            return pages
        assert after == pages[-1][-1]
    raise AssertionError("the pages never end")


def rule_row(pool: ConnectionPool, rule_id: str) -> dict[str, Any]:
    row = one(pool, "SELECT * FROM rules WHERE id = %s", rule_id)
    assert row is not None
    return row


def rule_count(pool: ConnectionPool, project: Project) -> int:
    return count(pool, "SELECT count(*) FROM rules WHERE project_id = %s", project.id)


def same_time(text: str, moment: datetime) -> bool:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) == moment


def cached(pool: ConnectionPool, project: Project, event: str = "contact.created") -> list[ActiveRule]:
    """What this process's rule cache answers for the project's ``event`` (loading it when it must)."""
    with pool.connection() as conn:
        return RULES.rules(conn, project.id, event)


# --- create and read


def test_create_echoes_every_field_stores_it_and_reads_it_back(
    client: TestClient[Any], pool: ConnectionPool, project: Project, clock: ManualClock
) -> None:
    conditions = {
        "all": [
            {"attribute": "conversation.status", "operator": "equal_to", "value": "pending"},
            {
                "any": [
                    {"attribute": "contact.tags", "operator": "contains", "value": "vip"},
                    {"attribute": "contact.attributes.score", "operator": "is_greater_than", "value": 80},
                    {"attribute": "contact.phone", "operator": "is_present"},
                ]
            },
        ]
    }
    actions = [LABEL, {"type": "snooze_until", "minutes": 30}]
    body = {
        "name": "  VIP follow-up  ",
        "event": "conversation.updated",
        "conditions": conditions,
        "actions": actions,
        "execution_delay_minutes": 15,
        "active": False,
        "position": 7,
    }
    response = client.post("/v1/rules", json=body)
    assert response.status_code == 201, response.text
    rule = response.json()

    assert set(rule) == {
        "id",
        "name",
        "event",
        "conditions",
        "actions",
        "execution_delay_minutes",
        "delay_in_business_hours",
        "runs_after",
        "active",
        "position",
        "created_at",
        "updated_at",
    }
    uuid.UUID(rule["id"])
    assert rule["name"] == "VIP follow-up"
    assert rule["event"] == "conversation.updated"
    assert rule["conditions"] == conditions
    assert rule["actions"] == actions
    assert (rule["execution_delay_minutes"], rule["active"], rule["position"]) == (15, False, 7)
    assert same_time(rule["created_at"], clock.now()) and rule["updated_at"] == rule["created_at"]

    row = rule_row(pool, rule["id"])
    assert row["project_id"] == project.id
    assert (row["name"], row["event"], row["conditions"], row["actions"]) == (
        "VIP follow-up",
        "conversation.updated",
        conditions,
        actions,
    )
    assert (row["execution_delay_minutes"], row["active"], row["position"]) == (15, False, 7)
    assert row["created_at"] == clock.now()

    read = client.get(f"/v1/rules/{rule['id']}")
    assert read.status_code == 200, read.text
    assert read.json() == rule


def test_create_defaults_always_at_once_active_and_last(
    client: TestClient[Any], pool: ConnectionPool, other_project: Project
) -> None:
    # another project's rules do not count towards "last"
    new_rule(client, headers=other_project.headers, position=500)

    first = new_rule(client, name="first")
    assert first["conditions"] == {"all": []}
    assert first["execution_delay_minutes"] is None
    assert first["active"] is True
    assert first["position"] == 0
    assert rule_row(pool, first["id"])["conditions"] == {"all": []}

    second = new_rule(client, name="second", conditions=None, execution_delay_minutes=None)
    assert second["conditions"] == {"all": []} and second["execution_delay_minutes"] is None
    assert second["position"] == 1

    placed = new_rule(client, name="placed", position=10)
    assert placed["position"] == 10
    assert new_rule(client, name="after it")["position"] == 11
    assert new_rule(client, name="zero", position=0)["position"] == 0
    assert new_rule(client, name="still last")["position"] == 12


@pytest.mark.parametrize("delay", [None, 1, 60, MAX_DELAY_MINUTES])
def test_execution_delay_is_stored(client: TestClient[Any], pool: ConnectionPool, delay: int | None) -> None:
    rule = new_rule(client, execution_delay_minutes=delay)
    assert rule["execution_delay_minutes"] == delay
    assert rule_row(pool, rule["id"])["execution_delay_minutes"] == delay
    assert client.get(f"/v1/rules/{rule['id']}").json()["execution_delay_minutes"] == delay


@pytest.mark.parametrize("event", EVENTS)
def test_every_event_is_accepted(client: TestClient[Any], pool: ConnectionPool, event: str) -> None:
    rule = new_rule(client, event=event)
    assert rule["event"] == event
    assert rule_row(pool, rule["id"])["event"] == event
    assert listed_ids(client, event=event) == [rule["id"]]


def test_the_valid_actions_cover_the_union() -> None:
    assert sorted(VALID_ACTIONS) == sorted(ACTION_TYPES)
    assert len(ACTION_TYPES) == 13


@pytest.mark.parametrize("kind", sorted(VALID_ACTIONS))
def test_every_action_type_is_accepted(
    client: TestClient[Any], pool: ConnectionPool, project: Project, kind: str
) -> None:
    action = with_sequence(VALID_ACTIONS[kind], make_sequence(pool, project.id))
    rule = new_rule(client, actions=[action])
    (echoed,) = rule["actions"]
    assert {key: echoed[key] for key in action} == action
    assert rule_row(pool, rule["id"])["actions"] == rule["actions"]
    assert client.get(f"/v1/rules/{rule['id']}").json()["actions"] == rule["actions"]


@pytest.mark.parametrize(
    "action",
    [
        {"type": "assign_agent", "assignee": None},
        {"type": "assign_team", "team": None},
        {"type": "change_priority", "priority": None},
        {"type": "enroll_in_sequence", "sequence_id": SEQUENCE},
        {"type": "enroll_in_sequence", "sequence_id": SEQUENCE, "anchor": "event_time"},
        {"type": "send_message", "text": "Just text"},
    ],
)
def test_optional_and_nullable_action_fields(
    client: TestClient[Any], pool: ConnectionPool, project: Project, action: dict[str, Any]
) -> None:
    action = with_sequence(action, make_sequence(pool, project.id))
    (echoed,) = new_rule(client, actions=[action])["actions"]
    assert {key: echoed[key] for key in action} == action
    if action["type"] == "enroll_in_sequence":
        assert echoed["anchor"] == action.get("anchor", "none") and echoed["variables"] == {}
    if action["type"] == "send_message":
        assert echoed["whatsapp_template"] is None


def test_a_rule_may_have_every_action_type_at_once_in_order(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    sequence_id = make_sequence(pool, project.id)
    actions = [with_sequence(VALID_ACTIONS[kind], sequence_id) for kind in ACTION_TYPES]
    rule = new_rule(client, actions=actions)
    assert [action["type"] for action in rule["actions"]] == ACTION_TYPES
    assert rule_row(pool, rule["id"])["actions"] == rule["actions"]


# --- listing


def test_list_pages_in_position_then_creation_order(
    client: TestClient[Any], clock: ManualClock, other_project: Project
) -> None:
    # Given rules whose positions do not follow their creation, two of them tied on position
    ids: dict[str, str] = {}
    for name, position in [("c", 2), ("a", 0), ("d", 2), ("e", 9), ("b", 1)]:
        ids[name] = new_rule(client, name=name, position=position)["id"]
        clock.advance(timedelta(seconds=1))
    new_rule(client, headers=other_project.headers, name="theirs", position=0)

    # Then one page lists them in run order: position, then creation
    page = listed(client)
    assert [item["name"] for item in page["items"]] == ["a", "b", "c", "d", "e"]
    assert page["next"] is None

    # And pages of two follow the same order, each ``next`` the last id of its page
    expected = [ids[name] for name in "abcde"]
    assert every_page(client, 2) == [expected[0:2], expected[2:4], expected[4:]]
    assert every_page(client, 1) == [[rule_id] for rule_id in expected]
    assert every_page(client, 5) == [expected]
    # a page exactly full has no next page
    assert listed(client, limit=5)["next"] is None
    assert listed(client, limit=4)["next"] == expected[3]
    # a cursor taken from the middle carries on after it
    assert [item["id"] for item in listed(client, after=ids["c"])["items"]] == expected[3:]


def test_list_ties_on_position_and_creation_time_keep_a_stable_order(client: TestClient[Any]) -> None:
    # rules created at the same moment with the same position: still every one once, in a stable order
    ids = {new_rule(client, name=f"same {i}", position=3)["id"] for i in range(5)}
    pages = every_page(client, 2)
    flat = [rule_id for page in pages for rule_id in page]
    assert sorted(flat) == sorted(ids) and len(flat) == 5
    assert flat == listed_ids(client)


def test_list_filters_by_event_and_active(client: TestClient[Any], clock: ManualClock) -> None:
    created_on = new_rule(client, name="created on", event="contact.created")["id"]
    clock.advance(timedelta(seconds=1))
    created_off = new_rule(client, name="created off", event="contact.created", active=False)["id"]
    clock.advance(timedelta(seconds=1))
    message_on = new_rule(client, name="message on", event="message.created")["id"]
    clock.advance(timedelta(seconds=1))
    message_off = new_rule(client, name="message off", event="message.created", active=False)["id"]

    assert listed_ids(client) == [created_on, created_off, message_on, message_off]
    assert listed_ids(client, event="contact.created") == [created_on, created_off]
    assert listed_ids(client, event="message.created") == [message_on, message_off]
    assert listed_ids(client, event="deal.stage_changed") == []
    assert listed_ids(client, active="true") == [created_on, message_on]
    assert listed_ids(client, active="false") == [created_off, message_off]
    assert listed_ids(client, event="message.created", active="false") == [message_off]
    # filters paginate
    assert every_page(client, 1, active="true") == [[created_on], [message_on]]
    assert every_page(client, 1, event="contact.created") == [[created_on], [created_off]]


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"event": "contact.deleted"}, 422, "event"),
        ({"active": "maybe"}, 400, "active"),
        ({"limit": 0}, 422, "limit"),
        ({"limit": 501}, 422, "limit"),
        ({"limit": "ten"}, 400, "limit"),
        ({"after": "not-a-uuid"}, 400, "after"),
    ],
)
def test_bad_list_parameters_are_problems_naming_them(
    client: TestClient[Any], params: dict[str, Any], status: int, field: str
) -> None:
    assert_problem(client.get("/v1/rules", params=params), status, field)


# --- update


PATCHES: list[tuple[str, Any, Any]] = [
    # field, the value sent, the value then stored (None: as sent)
    ("name", "  renamed  ", "renamed"),
    ("event", "lead.status_changed", None),
    ("conditions", leaf("contact.tags", "contains", "vip"), None),
    ("conditions", None, {"all": []}),
    ("actions", [{"type": "send_webhook", "url": "https://example.com/hook"}, LABEL], None),
    ("execution_delay_minutes", 120, None),
    ("execution_delay_minutes", None, None),
    ("active", False, None),
    ("position", 42, None),
]


@pytest.mark.parametrize(("field", "value", "stored"), PATCHES)
def test_patch_changes_one_field_and_keeps_the_others(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock, field: str, value: Any, stored: Any
) -> None:
    rule = new_rule(
        client,
        name="original",
        conditions=NAME_IS_ANA,
        actions=[LABEL, {"type": "snooze_until", "minutes": 5}],
        execution_delay_minutes=30,
        position=3,
    )
    clock.advance(timedelta(minutes=1))

    response = client.patch(f"/v1/rules/{rule['id']}", json={field: value})
    assert response.status_code == 200, response.text
    updated = response.json()

    expected = rule | {field: value if stored is None else stored, "updated_at": updated["updated_at"]}
    if field == "execution_delay_minutes":  # the badge follows the delay
        expected["runs_after"] = runs_after(expected[field])
    assert updated == expected
    assert same_time(updated["updated_at"], clock.now())
    assert updated["created_at"] == rule["created_at"]
    assert client.get(f"/v1/rules/{rule['id']}").json() == updated
    row = rule_row(pool, rule["id"])
    assert row[field] == expected[field]


def test_patch_with_every_field_at_once_and_with_none(client: TestClient[Any], clock: ManualClock) -> None:
    rule = new_rule(client)
    change = {
        "name": "all new",
        "event": "message.created",
        "conditions": leaf("message.content", "contains", "stop"),
        "actions": [{"type": "add_contact_tag", "tags": ["stopped"]}],
        "execution_delay_minutes": 1,
        "active": False,
        "position": 5,
    }
    updated = client.patch(f"/v1/rules/{rule['id']}", json=change).json()
    assert {key: updated[key] for key in change} == change

    clock.advance(timedelta(minutes=1))
    untouched = client.patch(f"/v1/rules/{rule['id']}", json={})
    assert untouched.status_code == 200, untouched.text
    assert untouched.json() == updated | {"updated_at": untouched.json()["updated_at"]}


def test_position_reorders_the_list(client: TestClient[Any], clock: ManualClock) -> None:
    ids: dict[str, str] = {}
    for name, position in [("a", 10), ("b", 20), ("c", 30)]:
        ids[name] = new_rule(client, name=name, position=position)["id"]
        clock.advance(timedelta(seconds=1))
    assert listed_ids(client) == [ids["a"], ids["b"], ids["c"]]

    moved = client.patch(f"/v1/rules/{ids['c']}", json={"position": 5})
    assert moved.status_code == 200, moved.text
    assert listed_ids(client) == [ids["c"], ids["a"], ids["b"]]

    client.patch(f"/v1/rules/{ids['a']}", json={"position": 25})
    assert listed_ids(client) == [ids["c"], ids["b"], ids["a"]]

    # a tie on position runs in creation order
    client.patch(f"/v1/rules/{ids['c']}", json={"position": 20})
    assert listed_ids(client) == [ids["b"], ids["c"], ids["a"]]
    assert every_page(client, 2) == [[ids["b"], ids["c"]], [ids["a"]]]


def test_enable_and_disable(client: TestClient[Any], pool: ConnectionPool, clock: ManualClock) -> None:
    rule = new_rule(client, conditions=NAME_IS_ANA)
    clock.advance(timedelta(minutes=1))

    disabled = client.post(f"/v1/rules/{rule['id']}/disable")
    assert disabled.status_code == 200, disabled.text
    assert disabled.json() == rule | {"active": False, "updated_at": disabled.json()["updated_at"]}
    assert same_time(disabled.json()["updated_at"], clock.now())
    assert rule_row(pool, rule["id"])["active"] is False
    assert listed_ids(client, active="true") == []
    # disabling a disabled rule is harmless
    assert client.post(f"/v1/rules/{rule['id']}/disable").json()["active"] is False

    enabled = client.post(f"/v1/rules/{rule['id']}/enable")
    assert enabled.status_code == 200, enabled.text
    assert enabled.json()["active"] is True
    assert {k: enabled.json()[k] for k in ("name", "conditions", "actions", "position")} == {
        k: rule[k] for k in ("name", "conditions", "actions", "position")
    }
    assert rule_row(pool, rule["id"])["active"] is True
    assert listed_ids(client, active="true") == [rule["id"]]
    assert client.post(f"/v1/rules/{rule['id']}/enable").json()["active"] is True


def test_delete_removes_the_rule(client: TestClient[Any], pool: ConnectionPool, project: Project) -> None:
    keep = new_rule(client, name="keep")
    gone = new_rule(client, name="gone")

    response = client.delete(f"/v1/rules/{gone['id']}")
    assert response.status_code == 204, response.text
    assert not response.content

    url = f"/v1/rules/{gone['id']}"
    assert_problem(client.get(url), 404, "rule_id")
    assert_problem(client.patch(url, json={"name": "back"}), 404, "rule_id")
    assert_problem(client.post(f"{url}/enable"), 404, "rule_id")
    assert_problem(client.post(f"{url}/disable"), 404, "rule_id")
    assert_problem(client.get(f"{url}/runs"), 404, "rule_id")
    assert_problem(client.delete(url), 404, "rule_id")
    assert listed_ids(client) == [keep["id"]]
    assert rule_count(pool, project) == 1


def test_runs_of_a_new_rule_are_empty_and_of_an_unknown_rule_404(client: TestClient[Any]) -> None:
    rule = new_rule(client)
    response = client.get(f"/v1/rules/{rule['id']}/runs")
    assert response.status_code == 200, response.text
    assert response.json() == {"items": []}
    assert client.get(f"/v1/rules/{rule['id']}/runs", params={"limit": 1}).json() == {"items": []}
    assert_problem(client.get(f"/v1/rules/{uuid.uuid4()}/runs"), 404, "rule_id")
    assert_problem(client.get(f"/v1/rules/{rule['id']}/runs", params={"limit": 0}), 422, "limit")


def test_unknown_rule_ids_are_404(client: TestClient[Any]) -> None:
    url = f"/v1/rules/{uuid.uuid4()}"
    assert_problem(client.get(url), 404, "rule_id")
    assert_problem(client.patch(url, json={"name": "x"}), 404, "rule_id")
    assert_problem(client.post(f"{url}/enable"), 404, "rule_id")
    assert_problem(client.post(f"{url}/disable"), 404, "rule_id")
    assert_problem(client.delete(url), 404, "rule_id")
    assert_problem(client.get("/v1/rules/not-a-uuid"), 404)


# --- bad input: the problem names the field, and nothing is saved

DEEPEST = ".all.0" * (MAX_DEPTH + 1)

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    # (what, fields of the rule body, the field named)
    ("unknown event", {"event": "contact.deleted"}, "event"),
    (
        "unknown attribute",
        {"conditions": leaf("contact.email", "equal_to", "x")},
        "conditions.all.0.attribute",
    ),
    ("unknown operator", {"conditions": leaf("contact.name", "matches", "x")}, "conditions.all.0.operator"),
    (
        "operator not for the attribute",
        {"conditions": leaf("contact.tags", "is_greater_than", 3)},
        "conditions.all.0.operator",
    ),
    ("a number for a text", {"conditions": leaf("contact.name", "equal_to", 5)}, "conditions.all.0.value"),
    ("in an empty list", {"conditions": leaf("contact.name", "in", [])}, "conditions.all.0.value"),
    (
        "a presence operator with a value",
        {"conditions": leaf("contact.phone", "is_present", "x")},
        "conditions.all.0.value",
    ),
    (
        "a NUL in a value",
        {"conditions": leaf("contact.name", "equal_to", "a\x00b")},
        "conditions.all.0.value",
    ),
    (
        "a NUL in an in list",
        {"conditions": leaf("contact.name", "in", ["a", "b\x00"])},
        "conditions.all.0.value.1",
    ),
    (
        "too deep",
        {"conditions": nest({"attribute": "contact.phone", "operator": "is_present"}, MAX_DEPTH + 1)},
        "conditions" + DEEPEST,
    ),
    (
        "a leaf without attribute",
        {"conditions": {"all": [{"operator": "is_present"}]}},
        "conditions.all.0.attribute",
    ),
    ("unknown action type", {"actions": [{"type": "explode"}]}, "actions.0.type"),
    ("empty labels", {"actions": [{"type": "add_label", "labels": []}]}, "actions.0.labels"),
    ("empty tags", {"actions": [{"type": "remove_contact_tag", "tags": []}]}, "actions.0.tags"),
    (
        "an invalid tag",
        {"actions": [LABEL, {"type": "add_contact_tag", "tags": ["ok", "-bad"]}]},
        "actions.1.tags.1",
    ),
    ("an invalid label", {"actions": [{"type": "remove_label", "labels": ["a b/"]}]}, "actions.0.labels.0"),
    ("an empty message", {"actions": [{"type": "send_message", "text": ""}]}, "actions.0.text"),
    ("a blank message", {"actions": [{"type": "send_message", "text": "  \n "}]}, "actions.0.text"),
    (
        "a malformed placeholder",
        {"actions": [{"type": "send_message", "text": "Hi {{ vars.x"}]},
        "actions.0.text",
    ),
    (
        "a malformed template parameter",
        {
            "actions": [
                {
                    "type": "send_message",
                    "text": "Hi",
                    "whatsapp_template": {"name": "hello", "parameters": ["{{vars"]},
                }
            ]
        },
        "actions.0.whatsapp_template.parameters.0",
    ),
    (
        "a bad template name",
        {"actions": [{"type": "send_message", "text": "Hi", "whatsapp_template": {"name": "Hello There"}}]},
        "actions.0.whatsapp_template.name",
    ),
    ("an ftp webhook", {"actions": [{"type": "send_webhook", "url": "ftp://x"}]}, "actions.0.url"),
    ("not a url", {"actions": [{"type": "send_webhook", "url": "not a url"}]}, "actions.0.url"),
    (
        "a webhook port out of range",
        {"actions": [{"type": "send_webhook", "url": "http://example.com:99999/hook"}]},
        "actions.0.url",
    ),
    (
        "a webhook port that is no number",
        {"actions": [{"type": "send_webhook", "url": "https://example.com:port/hook"}]},
        "actions.0.url",
    ),
    ("snooze 0", {"actions": [{"type": "snooze_until", "minutes": 0}]}, "actions.0.minutes"),
    ("snooze too long", {"actions": [{"type": "snooze_until", "minutes": 43_201}]}, "actions.0.minutes"),
    (
        "a status outside the enum",
        {"actions": [{"type": "change_status", "status": "closed"}]},
        "actions.0.status",
    ),
    ("an empty assignee", {"actions": [{"type": "assign_agent", "assignee": " "}]}, "actions.0.assignee"),
    ("an empty note", {"actions": [{"type": "add_private_note", "text": ""}]}, "actions.0.text"),
    ("delay 0", {"execution_delay_minutes": 0}, "execution_delay_minutes"),
    ("delay too long", {"execution_delay_minutes": MAX_DELAY_MINUTES + 1}, "execution_delay_minutes"),
    ("a negative position", {"position": -1}, "position"),
    ("a position too large", {"position": 1_000_001}, "position"),
    ("no actions", {"actions": []}, "actions"),
    ("too many actions", {"actions": [LABEL] * 21}, "actions"),
    ("an empty name", {"name": ""}, "name"),
    ("a blank name", {"name": "   "}, "name"),
    ("a too long name", {"name": "x" * 201}, "name"),
    ("a NUL in the name", {"name": "a\x00b"}, "name"),
]

BAD_SHAPES: list[tuple[str, dict[str, Any], str]] = [
    ("an unknown field", {"colour": "red"}, "colour"),
    ("conditions a list", {"conditions": [NAME_IS_ANA]}, "conditions"),
    ("an action without type", {"actions": [{"labels": ["x"]}]}, "actions.0.type"),
    ("an unknown action field", {"actions": [{"type": "add_label", "labels": ["x"], "x": 1}]}, "actions.0.x"),
    ("a missing action field", {"actions": [LABEL, {"type": "snooze_until"}]}, "actions.1.minutes"),
    ("labels a string", {"actions": [{"type": "add_label", "labels": "vip"}]}, "actions.0.labels"),
    ("minutes a word", {"actions": [{"type": "snooze_until", "minutes": "five"}]}, "actions.0.minutes"),
    ("actions an object", {"actions": LABEL}, "actions"),
    ("active a string", {"active": "yes"}, "active"),
    ("a name that is a number", {"name": 5}, "name"),
]


@pytest.mark.parametrize(
    ("fields", "status", "field"),
    [pytest.param(f, 422, p, id=w) for w, f, p in BAD_VALUES]
    + [pytest.param(f, 400, p, id=w) for w, f, p in BAD_SHAPES],
)
def test_creating_a_bad_rule_is_a_problem_naming_the_field_and_saves_nothing(
    client: TestClient[Any],
    pool: ConnectionPool,
    project: Project,
    fields: dict[str, Any],
    status: int,
    field: str,
) -> None:
    existing = new_rule(client, name="existing")
    assert_problem(client.post("/v1/rules", json=rule_body(**fields)), status, field)
    assert listed_ids(client) == [existing["id"]]
    assert rule_count(pool, project) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "actions": [LABEL]}, "event"),
        ({"name": "x", "event": "contact.created"}, "actions"),
        ({"event": "contact.created", "actions": [LABEL]}, "name"),
    ],
)
def test_a_missing_required_field_is_400(
    client: TestClient[Any], pool: ConnectionPool, project: Project, body: dict[str, Any], field: str
) -> None:
    assert_problem(client.post("/v1/rules", json=body), 400, field)
    assert rule_count(pool, project) == 0


def test_a_malformed_json_body_is_400(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    response = client.post(
        "/v1/rules", content=b'{"name": "x",', headers={"content-type": "application/json"}
    )
    assert_problem(response, 400)
    assert rule_count(pool, project) == 0


def test_conditions_as_deep_as_allowed_are_accepted(client: TestClient[Any]) -> None:
    deepest = nest({"attribute": "contact.phone", "operator": "is_present"}, MAX_DEPTH)
    assert new_rule(client, conditions=deepest)["conditions"] == deepest


@pytest.mark.parametrize(
    ("fields", "status", "field"),
    [pytest.param(f, 422, p, id=w) for w, f, p in BAD_VALUES]
    + [pytest.param(f, 400, p, id=w) for w, f, p in BAD_SHAPES]
    + [pytest.param({"position": None}, 400, "position", id="position null")],
)
def test_patching_with_a_bad_value_leaves_the_rule_as_it_was(
    client: TestClient[Any],
    pool: ConnectionPool,
    clock: ManualClock,
    fields: dict[str, Any],
    status: int,
    field: str,
) -> None:
    rule = new_rule(client, name="keep", conditions=NAME_IS_ANA, execution_delay_minutes=10, position=4)
    before = rule_row(pool, rule["id"])
    clock.advance(timedelta(minutes=1))
    # the good change (a new name) is not saved with the bad one
    body = {"name": "half saved"} | fields
    assert_problem(client.patch(f"/v1/rules/{rule['id']}", json=body), status, field)
    assert rule_row(pool, rule["id"]) == before
    assert client.get(f"/v1/rules/{rule['id']}").json() == rule


@pytest.mark.parametrize("whose", ["unknown", "another project's"])
def test_enrolling_in_a_sequence_not_of_the_project_is_404_naming_it(
    client: TestClient[Any],
    pool: ConnectionPool,
    project: Project,
    other_project: Project,
    clock: ManualClock,
    whose: str,
) -> None:
    sequence_id = uuid.uuid4() if whose == "unknown" else make_sequence(pool, other_project.id)
    action = {"type": "enroll_in_sequence", "sequence_id": str(sequence_id)}

    existing = new_rule(client)
    before = rule_row(pool, existing["id"])
    clock.advance(timedelta(minutes=1))

    assert_problem(
        client.post("/v1/rules", json=rule_body(actions=[LABEL, action])), 404, "actions.1.sequence_id"
    )
    assert listed_ids(client) == [existing["id"]]
    assert rule_count(pool, project) == 1

    assert_problem(
        client.patch(f"/v1/rules/{existing['id']}", json={"name": "x", "actions": [action]}),
        404,
        "actions.0.sequence_id",
    )
    assert rule_row(pool, existing["id"]) == before


# --- other projects' rules


def test_another_projects_rules_are_invisible_and_untouched(
    client: TestClient[Any], pool: ConnectionPool, project: Project, other_project: Project
) -> None:
    theirs = new_rule(client, headers=other_project.headers, name="Secret rule", conditions=NAME_IS_ANA)
    before = rule_row(pool, theirs["id"])
    mine = new_rule(client, name="mine")

    assert listed_ids(client) == [mine["id"]]
    assert listed_ids(client, event="contact.created", active="true") == [mine["id"]]
    # their cursor gives nothing of theirs on my list
    assert "Secret" not in client.get("/v1/rules", params={"after": theirs["id"]}).text

    url = f"/v1/rules/{theirs['id']}"
    for response in (
        client.get(url),
        client.patch(url, json={"name": "hijacked"}),
        client.patch(url, json={"position": 0, "active": False}),
        client.post(f"{url}/enable"),
        client.post(f"{url}/disable"),
        client.get(f"{url}/runs"),
        client.delete(url),
    ):
        body = assert_problem(response, 404, "rule_id")
        assert "Secret" not in response.text, body
    assert rule_row(pool, theirs["id"]) == before
    assert rule_count(pool, other_project) == 1

    # and theirs still answers to them
    assert client.get(url, headers=other_project.headers).json() == theirs
    assert rule_count(pool, project) == 1


# --- the per-process rule cache


def test_the_rule_cache_sees_every_change_made_through_the_api_at_once(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    # Given a project without rules, its (empty) rules cached
    assert cached(pool, project) == []

    # When an active rule for contact.created is created (and an inactive one, and one for another event)
    rule = new_rule(client, conditions=NAME_IS_ANA, execution_delay_minutes=5)
    new_rule(client, name="off", active=False)
    other = new_rule(client, name="other event", event="contact.updated")

    # Then the cache has it, its conditions compiled
    (active,) = cached(pool, project)
    assert str(active.id) == rule["id"]
    assert active.event == "contact.created"
    assert active.conditions == Group("all", (Leaf("contact.name", "equal_to", "Ana"),))
    assert "'Ana'" in active.traced.column and active.traced.nodes == 2  # its values written in
    assert [a.__struct_config__.tag for a in active.actions] == ["add_label"]
    assert active.execution_delay_minutes == 5
    assert [str(a.id) for a in cached(pool, project, "contact.updated")] == [other["id"]]

    # When it is disabled, then it is gone at once
    client.post(f"/v1/rules/{rule['id']}/disable")
    assert cached(pool, project) == []

    # When it is enabled again, then it is back
    client.post(f"/v1/rules/{rule['id']}/enable")
    assert [str(a.id) for a in cached(pool, project)] == [rule["id"]]

    # When its conditions, actions and delay change, then the compiled rule has the new ones
    new_conditions = {
        "any": [
            {"attribute": "contact.tags", "operator": "contains", "value": "vip"},
            {"attribute": "contact.attributes.score", "operator": "is_greater_than", "value": 80},
        ]
    }
    patched = client.patch(
        f"/v1/rules/{rule['id']}",
        json={
            "conditions": new_conditions,
            "actions": [{"type": "snooze_until", "minutes": 9}],
            "execution_delay_minutes": None,
        },
    )
    assert patched.status_code == 200, patched.text
    (active,) = cached(pool, project)
    assert active.conditions == Group(
        "any",
        (
            Leaf("contact.tags", "contains", "vip"),
            Leaf("contact.attributes.score", "is_greater_than", 80),
        ),
    )
    assert active.conditions.to_json() == new_conditions
    assert "Ana" not in active.traced.column and "'vip'" in active.traced.column
    assert active.traced.conditions == new_conditions and active.traced.nodes == 3
    assert [a.__struct_config__.tag for a in active.actions] == ["snooze_until"]
    assert active.execution_delay_minutes is None

    # When the event changes, then it moves to the other event's rules, in position order
    client.patch(f"/v1/rules/{rule['id']}", json={"event": "contact.updated", "position": 0})
    assert cached(pool, project) == []
    assert [str(a.id) for a in cached(pool, project, "contact.updated")] == [rule["id"], other["id"]]

    # When it is deleted, then it is gone
    assert client.delete(f"/v1/rules/{rule['id']}").status_code == 204
    assert [str(a.id) for a in cached(pool, project, "contact.updated")] == [other["id"]]


def test_a_rejected_change_leaves_the_cached_rules_alone(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    rule = new_rule(client, conditions=NAME_IS_ANA)
    (before,) = cached(pool, project)
    response = client.patch(f"/v1/rules/{rule['id']}", json={"active": False, "actions": []})
    assert_problem(response, 422, "actions")
    assert cached(pool, project) == [before]


class _ChangeDuringLoad:
    """A connection whose next query lets ``change`` commit after the query ran and before its caller
    goes on: the interleaving of a cache load (on one thread) with a change through the API (on another)."""

    def __init__(self, conn: Connection[Any], change: Callable[[], None]) -> None:
        self._conn = conn
        self._change = change

    def cursor(self, **kwargs: Any) -> Any:
        return _CursorChangingAfter(self._conn.cursor(**kwargs), self._change)

    def __getattr__(self, name: str) -> Any:
        """The rest as the connection (what compiling a rule's literal needs)."""
        return getattr(self._conn, name)


class _CursorChangingAfter:
    def __init__(self, cursor: Any, change: Callable[[], None]) -> None:
        self._cursor = cursor
        self._change = change

    def __enter__(self) -> _CursorChangingAfter:
        self._cursor.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.__exit__(*exc)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        result = self._cursor.execute(*args, **kwargs)
        self._change()
        return result


def test_a_change_committed_while_the_cache_loads_is_not_hidden_by_that_load(
    client: TestClient[Any], pool: ConnectionPool, project: Project
) -> None:
    # Given an active rule, and a cache load that read it just before the rule was disabled
    rule = new_rule(client, conditions=NAME_IS_ANA)

    def disable() -> None:
        assert client.post(f"/v1/rules/{rule['id']}/disable").status_code == 200

    with pool.connection() as conn:
        loading = cast(Connection[Any], _ChangeDuringLoad(conn, disable))
        read = RULES.rules(loading, project.id, "contact.created")
    # (what that load returns was true when it read it)
    assert [str(a.id) for a in read] == [rule["id"]]
    assert rule_row(pool, rule["id"])["active"] is False

    # Then the next reader sees the rule disabled: the invalidation is not undone by the load it raced
    assert cached(pool, project) == []


# --- the schema


def test_the_openapi_schema_describes_the_rules_api_and_the_action_union(client: TestClient[Any]) -> None:
    response = client.get("/schema/openapi.json")
    assert response.status_code == 200, response.text
    schema = response.json()
    paths = schema["paths"]
    for path in (
        "/v1/rules",
        "/v1/rules/{rule_id}",
        "/v1/rules/{rule_id}/enable",
        "/v1/rules/{rule_id}/disable",
        "/v1/rules/{rule_id}/runs",
    ):
        assert path in paths, sorted(paths)
    assert {"get", "post"} <= set(paths["/v1/rules"])
    assert {"get", "patch", "delete"} <= set(paths["/v1/rules/{rule_id}"])

    components = schema["components"]["schemas"]
    create = components["RuleCreate"]
    assert {"name", "event", "actions"} <= set(create["required"])
    assert sorted(create["properties"]["event"]["enum"]) == sorted(EVENTS)

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        found: dict[str, Any] = components[ref.rsplit("/", 1)[-1]] if ref else node
        return found

    items = create["properties"]["actions"]["items"]
    members = [resolve(member) for member in items.get("oneOf") or items.get("anyOf")]
    tags = [
        member["properties"]["type"].get("const") or member["properties"]["type"]["enum"][0]
        for member in members
    ]
    assert sorted(tags) == sorted(ACTION_TYPES)
    assert all("type" in member["required"] for member in members)
    if "discriminator" in items:
        assert items["discriminator"]["propertyName"] == "type"
    assert "RuleUpdate" in components and "Rule" in components
