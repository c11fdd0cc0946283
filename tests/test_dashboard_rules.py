"""The dashboard's rule pages over HTTP: creating and editing a rule by its form (the delay in
units, all / any condition groups, actions), the rule's executions, and its test against a contact."""

from __future__ import annotations

import html
import re
import uuid
from datetime import timedelta

import pytest

from libs.common.rules import executions, rules
from tests.conftest import sign_in
from tests.dashboard_helpers import api, create_rule_via_form, errors_on, field_error
from tests.helpers import rows
from tests.rule_helpers import process

# --- rules --------------------------------------------------------------------------------------------------


def test_the_rule_form_stores_the_delay_in_minutes_and_the_list_shows_the_badge(
    signed_in, project, runtime
) -> None:
    client, token = signed_in
    label = {"actions.0.type": "add_label", "actions.0.labels": "stale"}
    four_hours = create_rule_via_form(
        client,
        token,
        name="stale pending",
        event="conversation.updated",
        execute="delayed",
        delay_value="4",
        delay_unit="hours",
        **label,
    )
    two_days = create_rule_via_form(
        client,
        token,
        name="two days",
        event="message.created",
        execute="delayed",
        delay_value="2",
        delay_unit="days",
        **label,
    )
    at_once = create_rule_via_form(
        client,
        token,
        name="at once",
        event="message.created",
        execute="immediately",
        delay_value="4",
        delay_unit="hours",
        **label,
    )
    stored = dict(rows(runtime.pool, "SELECT id::text, execution_delay_minutes FROM rules"))
    assert stored == {four_hours: 240, two_days: 2880, at_once: None}
    listing = client.get("/app/rules").text
    assert listing.count('<span class="badge">runs after 4h</span>') == 1
    assert listing.count('<span class="badge">runs after 2d</span>') == 1
    assert "immediately" in listing
    # the edit form shows the delay in its largest unit
    edit = client.get(f"/app/rules/{four_hours}/edit").text
    assert 'name="delay_value" value="4"' in edit
    assert '<option value="hours" selected>' in edit
    assert 'id="execute-delayed" name="execute" value="delayed" checked' in edit
    # 90 minutes stays in minutes
    response = client.post(
        f"/app/rules/{four_hours}/edit",
        data={
            "_csrf": token,
            "name": "stale pending",
            "event": "conversation.updated",
            "execute": "delayed",
            "delay_value": "90",
            "delay_unit": "minutes",
            "active": "on",
            "_op": "save",
            **label,
        },
        follow_redirects=False,
    )
    assert response.status_code == 303
    assert rows(runtime.pool, "SELECT execution_delay_minutes FROM rules WHERE id = %s", four_hours) == [
        (90,)
    ]
    assert "runs after 1h 30m" in client.get("/app/rules").text


@pytest.mark.parametrize(
    ("fields", "name", "message"),
    [
        (
            {"execute": "delayed", "delay_value": "0", "delay_unit": "hours"},
            "execution_delay_minutes",
            ">= 1",
        ),
        (
            {"execute": "delayed", "delay_value": "31", "delay_unit": "days"},
            "execution_delay_minutes",
            "<= 43200",
        ),
        (
            {"execute": "delayed", "delay_value": "soon", "delay_unit": "hours"},
            "execution_delay_minutes",
            "whole number",
        ),
        ({"name": "  "}, "name", "1 to 200 characters"),
        (
            {"conditions.all.0.attribute": "", "conditions.all.0.operator": "equal_to"},
            "conditions.all.0.attribute",
            "attribute is required",
        ),
        (
            {
                "conditions.all.0.attribute": "contact.tags",
                "conditions.all.0.operator": "starts_with",
                "conditions.all.0.value": "v",
            },
            "conditions.all.0.operator",
            "does not apply",
        ),
        (
            {
                "conditions.all.0.attribute": "custom",
                "conditions.all.0.custom_key": "score",
                "conditions.all.0.operator": "is_greater_than",
                "conditions.all.0.value": "high",
                "conditions.all.0.type": "number",
            },
            "conditions.all.0.value",
            "'high' is not a number",
        ),
        (
            {
                "conditions.all.0.attribute": "contact.opted_out",
                "conditions.all.0.operator": "equal_to",
                "conditions.all.0.value": "yes",
                "conditions.all.0.type": "text",
            },
            "conditions.all.0.value",
            "the value must be true or false",
        ),
        ({"actions.0.labels": "ok, bad label!"}, "actions.0.labels", "not a valid tag"),
        (
            {"actions.0.type": "snooze_until", "actions.0.minutes": "forever"},
            "actions.0.minutes",
            "Expected `int`",
        ),
        (
            {"actions.0.type": "enroll_in_sequence", "actions.0.sequence_id": str(uuid.uuid4())},
            "actions.0.sequence_id",
            "sequence not found",
        ),
    ],
)
def test_rule_errors_are_shown_next_to_their_field(signed_in, runtime, fields, name, message) -> None:
    client, token = signed_in
    data = {
        "_csrf": token,
        "_op": "save",
        "name": "r",
        "event": "message.created",
        "execute": "immediately",
        "conditions.kind": "all",
        "actions.0.type": "add_label",
        "actions.0.labels": "x",
    } | fields
    response = client.post("/app/rules/new", data=data)
    assert response.status_code in (404, 422), response.status_code
    assert message in field_error(response.text, name)
    assert 'class="error-summary"' in response.text
    assert rows(runtime.pool, "SELECT count(*) FROM rules") == [(0,)]


def test_the_condition_builder_nests_all_and_any_groups(signed_in, project, runtime) -> None:
    client, token = signed_in
    base = {
        "_csrf": token,
        "name": "price",
        "event": "message.created",
        "execute": "immediately",
        "actions.0.type": "add_label",
        "actions.0.labels": "pricing",
        "active": "on",
    }
    # the builder's buttons change the form and save nothing
    step1 = client.post(
        "/app/rules/new", data=base | {"conditions.kind": "all", "_op": "add_leaf:conditions"}
    )
    assert 'name="conditions.all.0.attribute"' in step1.text
    step2 = client.post(
        "/app/rules/new",
        data=base
        | {
            "conditions.kind": "all",
            "conditions.all.0.attribute": "message.type",
            "conditions.all.0.operator": "equal_to",
            "conditions.all.0.value": "incoming",
            "_op": "add_group:conditions",
        },
    )
    assert (
        'name="conditions.all.1.kind"' in step2.text
        and 'name="conditions.all.1.any.0.attribute"' in step2.text
    )
    step3 = client.post(
        "/app/rules/new",
        data=base
        | {"conditions.kind": "all", "conditions.all.1.kind": "any", "_op": "add_leaf:conditions.all.1"},
    )
    assert 'name="conditions.all.0.any.0.attribute"' in step3.text  # the group is now the first child
    removed = client.post(
        "/app/rules/new",
        data=base
        | {
            "conditions.kind": "all",
            "conditions.all.0.attribute": "message.type",
            "conditions.all.1.kind": "any",
            "conditions.all.1.any.0.attribute": "message.content",
            "_op": "remove:conditions.all.1",
        },
    )
    assert "conditions.all.1" not in removed.text
    assert rows(runtime.pool, "SELECT count(*) FROM rules") == [(0,)]
    # saving the tree (a group whose kind was switched from all to any keeps its children)
    rule_id = create_rule_via_form(
        client,
        token,
        **{k: v for k, v in base.items() if k != "_csrf"},
        **{
            "conditions.kind": "all",
            "conditions.all.0.attribute": "message.type",
            "conditions.all.0.operator": "equal_to",
            "conditions.all.0.value": "incoming",
            "conditions.all.0.type": "text",
            "conditions.all.1.kind": "any",
            "conditions.all.1.all.0.attribute": "message.content",
            "conditions.all.1.all.0.operator": "contains",
            "conditions.all.1.all.0.value": "price",
            "conditions.all.1.all.0.type": "text",
            "conditions.all.1.all.1.attribute": "custom",
            "conditions.all.1.all.1.custom_key": "score",
            "conditions.all.1.all.1.operator": "is_greater_than",
            "conditions.all.1.all.1.value": "80",
            "conditions.all.1.all.1.type": "number",
            "conditions.all.1.all.2.attribute": "contact.tags",
            "conditions.all.1.all.2.operator": "in",
            "conditions.all.1.all.2.value": "vip, lead",
            "conditions.all.1.all.2.type": "text",
            "conditions.all.1.all.3.attribute": "conversation.status",
            "conditions.all.1.all.3.operator": "attribute_changed",
            "conditions.all.1.all.3.from": "open",
            "conditions.all.1.all.3.value": "pending",
            "conditions.all.1.all.3.type": "text",
            "conditions.all.1.all.4.attribute": "contact.opted_out",
            "conditions.all.1.all.4.operator": "is_present",
        },
    )
    with runtime.pool.connection() as conn:
        rule = rules.get_rule(conn, project.id, uuid.UUID(rule_id))
    assert rule.conditions == {
        "all": [
            {"attribute": "message.type", "operator": "equal_to", "value": "incoming"},
            {
                "any": [
                    {"attribute": "message.content", "operator": "contains", "value": "price"},
                    {"attribute": "contact.attributes.score", "operator": "is_greater_than", "value": 80},
                    {"attribute": "contact.tags", "operator": "in", "value": ["vip", "lead"]},
                    {
                        "attribute": "conversation.status",
                        "operator": "attribute_changed",
                        "value": {"from": "open", "to": "pending"},
                    },
                    {"attribute": "contact.opted_out", "operator": "is_present"},
                ]
            },
        ]
    }
    # the edit form draws the same tree, and saving it unchanged keeps it
    edit = client.get(f"/app/rules/{rule_id}/edit").text
    assert 'name="conditions.all.1.any.1.custom_key" value="score"' in edit
    summary = client.get("/app/rules").text
    assert "Message direction equal to" in summary and " or " in summary


def test_rules_actions_enable_disable_delete(signed_in, runtime) -> None:
    client, token = signed_in
    rule_id = create_rule_via_form(
        client,
        token,
        name="r",
        event="contact.created",
        execute="immediately",
        **{"actions.0.type": "add_contact_tag", "actions.0.tags": "new"},
    )
    add = client.post(
        f"/app/rules/{rule_id}/edit",
        data={
            "_csrf": token,
            "name": "r",
            "event": "contact.created",
            "actions.0.type": "add_contact_tag",
            "actions.0.tags": "new",
            "new_action_type": "send_webhook",
            "_op": "add_action",
        },
    )
    assert 'name="actions.1.url"' in add.text
    assert client.post(f"/app/rules/{rule_id}/disable", data={"_csrf": token}).status_code == 200
    assert rows(runtime.pool, "SELECT active FROM rules") == [(False,)]
    assert client.post(f"/app/rules/{rule_id}/enable", data={"_csrf": token}).status_code == 200
    assert rows(runtime.pool, "SELECT active FROM rules") == [(True,)]
    assert "Deleted." in client.post(f"/app/rules/{rule_id}/delete", data={"_csrf": token}).text
    assert rows(runtime.pool, "SELECT count(*) FROM rules") == [(0,)]


def test_a_rules_executions_pending_executed_and_skipped_with_reasons(
    signed_in, project, runtime, clock
) -> None:
    client, token = signed_in
    rule_id = create_rule_via_form(
        client,
        token,
        name="welcome later",
        event="contact.created",
        execute="delayed",
        delay_value="1",
        delay_unit="hours",
        **{"actions.0.type": "add_contact_tag", "actions.0.tags": "welcomed"},
    )
    for phone in ("+14155550001", "+14155550002"):
        api(client, project, "POST", "/v1/contacts", json={"phone": phone})
    process(runtime)
    page = client.get(f"/app/rules/{rule_id}?status=pending").text
    assert page.count('status-pending">pending') == 2
    # one runs, then the rule is disabled and the other is skipped when it falls due
    clock.advance(timedelta(minutes=61))
    executions.sweep(runtime.pool, clock, stale_after=timedelta(days=1), limit=1)
    client.post(f"/app/rules/{rule_id}/disable", data={"_csrf": token})
    executions.sweep(runtime.pool, clock, stale_after=timedelta(days=1))
    page = client.get(f"/app/rules/{rule_id}").text
    assert 'status-executed">executed' in page
    assert 'status-skipped">skipped' in page and "Rule disabled" in page
    assert "No pending executions." in client.get(f"/app/rules/{rule_id}?status=pending").text


# --- test against a contact --------------------------------------------------------------------------------


def tried(page: str, tree: str = "tried") -> dict[str, tuple[str, str]]:
    """Each evaluated node of the page's ``tree`` (a test's result, a run's trace), by its path: its result
    and its words."""
    node = rf'<li class="tried-node" id="{tree}-f-([^"]+)">\s*'
    result = r'<span class="status [^"]+">([^<]+)</span>\s*([^<\n]*)'
    found = re.findall(node + result, page)
    return {path: (result, html.unescape(words.strip())) for path, result, words in found}


def test_testing_a_rule_against_a_contact_shows_each_condition_and_what_would_run(
    signed_in, project, runtime
) -> None:
    client, token = signed_in
    rule = api(
        client,
        project,
        "POST",
        "/v1/rules",
        json={
            "name": "vip nurture",
            "event": "contact.tag_added",
            "conditions": {
                "all": [
                    {"attribute": "event.tags_added", "operator": "contains", "value": "vip"},
                    {
                        "any": [
                            {"attribute": "contact.attributes.plan", "operator": "equal_to", "value": "gold"},
                            {"attribute": "contact.name", "operator": "starts_with", "value": "Ada"},
                        ]
                    },
                ]
            },
            "actions": [{"type": "add_contact_tag", "tags": ["nurtured"]}],
            "execution_delay_minutes": 90,
        },
    )
    phone = "+14155550123"
    api(client, project, "POST", "/v1/contacts", json={"phone": phone, "attributes": {"plan": "silver"}})
    page = client.get(f"/app/rules/{rule['id']}").text
    assert "Test against a contact" in page and 'action="/app/rules/' in page

    # the contact by its phone, the event's data as JSON
    data = {"_csrf": token, "contact": phone, "event": '{"tags_added": ["vip"]}'}
    answer = client.post(f"/app/rules/{rule['id']}/test", data=data)
    assert answer.status_code == 200, errors_on(answer.text)
    assert "The rule does not match" in answer.text
    assert tried(answer.text) == {
        "conditions": ("does not hold", "All of these"),
        "conditions-all-0": ("holds", 'Tags this change added contains "vip"'),
        "conditions-all-1": ("does not hold", "Any of these"),
        "conditions-all-1-any-0": ("does not hold", 'Contact attribute “plan” equal to "gold"'),
        "conditions-all-1-any-1": ("does not hold", 'Contact\'s name starts with "Ada"'),
    }
    assert "(value: <code>&#34;silver&#34;</code>)" in answer.text  # what it compared
    assert "(value: <code>absent</code>)" in answer.text  # no name
    assert "None: the conditions do not hold." in answer.text

    api(client, project, "PATCH", f"/v1/contacts/{rule_contact(runtime, phone)}", json={"name": "Ada"})
    matched = client.post(f"/app/rules/{rule['id']}/test", data=data).text
    assert "The rule matches" in matched and "add contact tag" in matched.lower()
    assert "Each event is an episode of its own" in matched
    assert rows(runtime.pool, "SELECT count(*) FROM followup_triggers") == [(0,)]


def test_a_runs_page_shows_the_conditions_when_it_ran_and_when_it_fell_due(
    signed_in, project, other_project, runtime, clock
) -> None:
    client, _ = signed_in
    gold = {"attribute": "contact.attributes.plan", "operator": "equal_to", "value": "gold"}
    body = {"name": "gold later", "event": "contact.created", "conditions": {"all": [gold]}}
    actions = [{"type": "add_contact_tag", "tags": ["welcomed"]}]
    rule = api(
        client, project, "POST", "/v1/rules", json=body | {"actions": actions, "execution_delay_minutes": 60}
    )
    phone = "+14155550142"
    api(client, project, "POST", "/v1/contacts", json={"phone": phone, "attributes": {"plan": "gold"}})
    process(runtime)

    # the rule's page lists the run with its trace's short form, and links to it
    page = client.get(f"/app/rules/{rule['id']}").text
    assert "its condition held" in page
    found = re.search(r'href="(/app/rules/[^"]+/runs/[^"]+)"', page)
    assert found is not None
    run_page = found.group(1)

    # the plan changes before it falls due: the re-check does not hold, and the run's page says both
    api(
        client,
        project,
        "PATCH",
        f"/v1/contacts/{rule_contact(runtime, phone)}",
        json={"attributes": {"plan": "silver"}},
    )
    clock.advance(timedelta(minutes=61))
    executions.sweep(runtime.pool, clock, stale_after=timedelta(days=1))
    shown = client.get(run_page).text
    plan = 'Contact attribute “plan” equal to "gold"'
    assert tried(shown, "run") == {
        "conditions": ("holds", "All of these"),
        "conditions-all-0": ("holds", plan),
    }
    assert tried(shown, "due") == {
        "conditions": ("does not hold", "All of these"),
        "conditions-all-0": ("does not hold", plan),
    }
    assert "(value: <code>&#34;silver&#34;</code>)" in shown and 'status-skipped">skipped' in shown

    # another project's run is not found
    client.cookies.clear()
    sign_in(client, other_project)
    assert client.get(run_page).status_code == 404


def rule_contact(runtime, phone: str) -> str:
    [(contact_id,)] = rows(runtime.pool, "SELECT id::text FROM contacts WHERE phone = %s", phone)
    return str(contact_id)


@pytest.mark.parametrize(
    ("fields", "name", "message"),
    [
        ({"contact": ""}, "contact", "enter the contact's phone number"),
        ({"contact": "+14155559999"}, "contact", "no contact has the phone number"),
        ({"contact": str(uuid.UUID(int=7))}, "contact", "contact not found"),
        ({"conversation": "not an id"}, "conversation", "enter the conversation's id"),
        ({"event": "{nope"}, "event", "not JSON"),
        ({"event": '{"tag": "vip"}'}, "event", "tag"),
        ({"event": '{"message": {"type": "note"}}'}, "event", "'note'"),  # event.message.type
    ],
)
def test_a_bad_test_input_is_shown_next_to_its_field(signed_in, project, fields, name, message) -> None:
    client, token = signed_in
    rule = api(
        client,
        project,
        "POST",
        "/v1/rules",
        json={"name": "r", "event": "message.created", "actions": [{"type": "add_label", "labels": ["x"]}]},
    )
    contact = api(client, project, "POST", "/v1/contacts", json={"phone": "+14155550100"})
    api(
        client,
        project,
        "POST",
        "/v1/events",
        json={"type": "conversation.created", "contact_id": contact["id"]},
    )
    data = {"_csrf": token, "contact": "+14155550100", **fields}
    page = client.post(f"/app/rules/{rule['id']}/test", data=data)
    assert page.status_code in (404, 422), page.text
    assert message in field_error(page.text, name)
    assert "Test against a contact" in page.text  # the rule's page, the form kept
