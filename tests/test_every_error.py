"""Every error at once: a definition or settings body with several problems answers all of them, each
``{field, message}`` in the problem's ``errors``, in plain words that name the allowed values and bounds;
the dashboard shows each beside its field."""

from __future__ import annotations

import uuid
from typing import Any

from tests.dashboard_helpers import add_step, field_error, make_sequence_via_form
from tests.helpers import rows
from tests.test_api_sequences import assert_problem, message_step, new_sequence


def errors_of(body: dict[str, Any]) -> dict[str, str]:
    return {error["field"]: error["message"] for error in body["errors"]}


def test_a_definition_with_four_bad_steps_answers_all_four_in_plain_words(client, pool, project) -> None:
    # Given four steps, each wrong in its own way, and a wrong re-entry policy
    steps = [
        message_step(delay_seconds=-1),
        {"kind": "sms", "text": "Hi"},
        message_step(only_if=["whenever"]),
        {"kind": "ai", "instructions": "Ask", "fallback": {"kind": "skip"}, "min_confidence": 2},
    ]
    body = {"name": "bad", "definition": {"steps": steps, "reentry": "sometimes"}}
    # When the sequence is created
    response = client.post("/v1/sequences", json=body)
    # Then each is answered, a value refused each (422), none of them in msgspec's words
    problem = assert_problem(response, 422, "definition.steps.0.delay_seconds")
    assert errors_of(problem) == {
        "definition.steps.0.delay_seconds": "delay_seconds must be a whole number from 0 to 31622400",
        "definition.steps.1.kind": "kind is one of message, ai, branch, wait_for_reply, split (not 'sms')",
        "definition.steps.2.only_if.0": "each item of only_if is one of no_reply_since_previous_step, "
        "no_reply_since_enrollment, previous_not_read (not 'whenever')",
        "definition.steps.3.min_confidence": "min_confidence must be a number from 0 to 1",
        "definition.reentry": "reentry is one of never, after_finished, always (not 'sometimes')",
    }
    kinds = "kind is one of message, ai, branch, wait_for_reply, split"
    assert f"definition.steps.1.kind: {kinds}" in problem["detail"]
    assert rows(pool, "SELECT id FROM followup_sequences WHERE project_id = %s", project.id) == []


def test_shape_errors_are_answered_together_and_make_the_request_a_400(client) -> None:
    steps = [
        {"kind": "message"},  # text missing
        {"kind": "message", "text": 5},  # a number for a text
        message_step(colour="red", delay_seconds=-5),  # an unknown field, a bound
    ]
    response = client.post("/v1/sequences", json={"name": "bad", "definition": {"steps": steps}})
    problem = assert_problem(response, 400)
    errors = errors_of(problem)
    assert errors["definition.steps.0.text"] == "text is required"
    assert errors["definition.steps.1.text"] == "text must be a string, not a whole number"
    assert errors["definition.steps.2.colour"].startswith("colour is not a field here; the fields are kind,")
    assert errors["definition.steps.2.delay_seconds"] == (
        "delay_seconds must be a whole number from 0 to 31622400"
    )
    assert len(errors) == 4


def test_publishing_answers_every_rule_the_draft_breaks(client) -> None:
    sequence_id = new_sequence(
        client,
        message_step(only_if=["no_reply_since_previous_step", "previous_not_read"]),
        message_step(text="   "),
        message_step(delay_seconds=60, anchor_offset_seconds=-3600),
        message_step(text="Hi {{vars.x", send_window={"start": "25:00", "end": "25:00", "days": []}),
    )
    response = client.post(f"/v1/sequences/{sequence_id}/publish")
    problem = assert_problem(response, 422)
    assert [(e["field"], e["message"]) for e in problem["errors"]] == [
        ("definition.steps.0.only_if", "the first step has no previous step"),
        ("definition.steps.0.only_if", "the first step has no previous follow-up"),
        ("definition.steps.1.text", "text must not be empty"),
        (
            "definition.steps.2.anchor_offset_seconds",
            "a step is timed either by delay_seconds or by anchor_offset_seconds, not both",
        ),
        ("definition.steps.3.send_window.start", "start must be a 24-hour time HH:MM"),
        ("definition.steps.3.send_window.end", "end must be a 24-hour time HH:MM"),
        (
            "definition.steps.3.send_window",
            "start and end must differ (a window that never closes is no window)",
        ),
        ("definition.steps.3.send_window.days", "a window needs at least one day"),
        ("definition.steps.3.text", problem["errors"][-1]["message"]),
    ]
    assert "placeholder" in problem["errors"][-1]["message"]
    assert client.get(f"/v1/sequences/{sequence_id}/versions").json()["items"] == []


def test_a_settings_body_with_several_problems_answers_all_and_stores_nothing(client) -> None:
    body = {
        "send_delay_ms": -1,
        "consent_mode": "always",
        "retention_days": 0,
        "send_window": {"start": "09:00", "end": "17:00", "days": ["mon", "someday"]},
    }
    problem = assert_problem(client.put("/v1/settings", json=body), 422)
    assert errors_of(problem) == {
        "send_delay_ms": "send_delay_ms must be a whole number from 0 to 3600000",
        "consent_mode": "consent_mode is one of off, required (not 'always')",
        "retention_days": "retention_days must be a whole number from 1 to 3650",
        "send_window.days.1": "each item of days is one of mon, tue, wed, thu, fri, sat, sun (not 'someday')",
    }
    # the domain's checks of settings that decode answer together too
    body = {
        "send_window": {"start": "9am", "end": "17:00"},
        "business_hours": {"start": "09:00", "end": "09:00", "days": ["mon", "mon"]},
    }
    problem = assert_problem(client.put("/v1/settings", json=body), 422)
    assert set(errors_of(problem)) == {"send_window.start", "business_hours", "business_hours.days"}
    assert client.get("/v1/settings").json()["send_delay_ms"] == 0


def test_settings_with_a_type_error_answer_the_checks_of_the_rest_too(client) -> None:
    # Given a type error beside windows the checks after decoding refuse
    body: dict[str, Any] = {
        "send_delay_ms": "soon",
        "send_window": {"start": "9am", "end": "17:00"},
        "business_hours": {"start": "09:00", "end": "09:00"},
    }
    # When the settings are replaced
    problem = assert_problem(client.put("/v1/settings", json=body), 400)
    # Then the type error and each check's error are answered together: a shape error makes it a 400
    assert errors_of(problem) == {
        "send_delay_ms": "send_delay_ms must be a whole number, not a string",
        "send_window.start": "start must be a 24-hour time HH:MM",
        "business_hours": "start and end must differ (a window that never closes is no window)",
    }
    # a value refused on decoding and a check's error are both about values: 422
    body = {"retention_days": 0, "send_window": {"start": "09:00", "end": "17:00", "days": ["mon", "mon"]}}
    problem = assert_problem(client.put("/v1/settings", json=body), 422)
    assert errors_of(problem) == {
        "retention_days": "retention_days must be a whole number from 1 to 3650",
        "send_window.days": "a day is given twice",
    }
    assert client.get("/v1/settings").json()["send_window"] is None


def test_a_draft_with_a_type_error_answers_its_blank_name_too(client, pool, project) -> None:
    body = {"name": "   ", "definition": {"steps": [message_step(delay_seconds="60")]}}
    problem = assert_problem(client.post("/v1/sequences", json=body), 400)
    assert errors_of(problem) == {
        "name": "name must be 1 to 200 characters",
        "definition.steps.0.delay_seconds": "delay_seconds must be a whole number, not a string",
    }
    sequence_id = new_sequence(client, message_step())
    body = {"name": " ", "definition": {"steps": [message_step(colour="red")], "reentry": "sometimes"}}
    problem = assert_problem(client.patch(f"/v1/sequences/{sequence_id}", json=body), 400)
    assert set(errors_of(problem)) == {"name", "definition.steps.0.colour", "definition.reentry"}
    assert len(rows(pool, "SELECT id FROM followup_sequences WHERE project_id = %s", project.id)) == 1


def test_one_off_steps_with_a_refused_step_answer_the_publish_checks_of_the_others(client) -> None:
    # Given a one-off whose second step does not decode and whose first and third break publish checks
    steps = [
        message_step(only_if=["previous_not_read"]),
        {"kind": "sms", "text": "Hi"},
        message_step(text="Hi {{vars.x", send_window={"start": "09:00", "end": "09:00"}),
    ]
    long_name = "v" * 65
    body = {"contact_id": str(uuid.uuid4()), "steps": steps, "variables": {long_name: 1}}
    # When the contact is enrolled in it
    problem = assert_problem(client.post("/v1/enrollments", json=body), 422)
    # Then every error is answered, the third step's named at its own index
    assert errors_of(problem) == {
        "steps.1.kind": "kind is one of message, ai (not 'sms')",
        "steps.0.only_if": "the first step has no previous follow-up",
        "steps.2.send_window": "start and end must differ (a window that never closes is no window)",
        "steps.2.text": 'unclosed placeholder "{{vars.x": "{{" without a matching "}}"',
        f"variables.{long_name}": "variables names are 1 to 64 characters",
    }


def test_a_follow_up_with_a_type_error_answers_its_text_too(client) -> None:
    body = {"text": "Hi {{vars.x", "delay_seconds": "soon", "media_kind": "image"}
    problem = assert_problem(client.post(f"/v1/conversations/{uuid.uuid4()}/follow-up", json=body), 400)
    # the one-off's only step is the request: its errors name the request's fields
    assert errors_of(problem) == {
        "delay_seconds": "delay_seconds must be a whole number, not a string",
        "media_url": "media_kind needs a media_url",
        "text": 'unclosed placeholder "{{vars.x": "{{" without a matching "}}"',
    }


def test_a_rule_with_a_refused_action_answers_its_name_and_conditions_too(client) -> None:
    body = {
        "name": "  ",
        "event": "contact.created",
        "conditions": {"all": [{"attribute": "event.tags_added", "operator": "contains", "value": "vip"}]},
        "actions": [{"type": "launch_rocket"}],
        "delay_in_business_hours": True,
    }
    problem = assert_problem(client.post("/v1/rules", json=body), 422)
    errors = errors_of(problem)
    # the list the refused action was taken out of is not "a rule needs at least one action"
    assert set(errors) == {
        "actions.0.type",
        "name",
        "conditions.all.0.attribute",
        "delay_in_business_hours",
    }
    assert errors["conditions.all.0.attribute"].startswith("event.tags_added is a field of contact.tag_added")
    assert client.get("/v1/rules").json()["items"] == []


def test_the_step_form_shows_every_error_beside_its_field(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    data = {
        "_csrf": token,
        "_op": "save",
        "kind": "ai",
        "instructions": " ",
        "fallback.kind": "template",
        "fallback.text": "Hi {{vars.x",
        "min_confidence": "2",
        "history_messages": "99",
        "timing": "wait",
        "wait_value": "0",
        "wait_unit": "hours",
        "variables": "1st",
    }
    response = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data)
    assert response.status_code == 422
    assert field_error(response.text, "min_confidence") == "min_confidence must be a number from 0 to 1"
    assert field_error(response.text, "history_messages") == (
        "history_messages must be a whole number from 0 to 50"
    )
    assert "variable's name" in field_error(response.text, "variables")
    # once the types are right, the step's own checks are all shown too
    data |= {"min_confidence": "0.5", "history_messages": "10", "variables": ""}
    response = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data)
    assert response.status_code == 422
    assert field_error(response.text, "instructions") == "instructions must not be empty"
    assert "placeholder" in field_error(response.text, "fallback.text")


def test_publishing_in_the_dashboard_shows_each_error_on_its_step(signed_in) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="One", only_if="no_reply_since_enrollment")
    add_step(client, token, sequence_id, text="Two")
    client.post(f"/app/sequences/{sequence_id}/steps/0/move", data={"_csrf": token, "direction": "down"})
    add_step(client, token, sequence_id, text="Three", only_if="previous_not_read")
    client.post(f"/app/sequences/{sequence_id}/steps/2/move", data={"_csrf": token, "direction": "up"})
    client.post(f"/app/sequences/{sequence_id}/steps/1/move", data={"_csrf": token, "direction": "up"})
    refused = client.post(f"/app/sequences/{sequence_id}/publish", data={"_csrf": token})
    assert refused.status_code == 422
    first_step = refused.text.split('id="f-definition-steps-0"')[1].split("</li>")[0]
    assert "the first step has no previous follow-up" in first_step


def test_the_settings_page_shows_every_error_beside_its_field(signed_in) -> None:
    client, token = signed_in
    data = {
        "_csrf": token,
        "consent_mode": "off",
        "service_window": "off",
        "retention_days": "0",
        "send_delay_ms": "soon",
        "send_window.enabled": "on",
        "send_window.start": "25:00",
        "send_window.end": "10:00",
        "send_window.days": "mon",
        "business_hours.enabled": "on",
        "business_hours.start": "09:00",
        "business_hours.end": "09:00",
        "business_hours.days": "tue",
    }
    response = client.post("/app/settings", data=data)
    assert response.status_code == 422
    assert field_error(response.text, "send_delay_ms") == "'soon' is not a whole number"
    assert (
        field_error(response.text, "retention_days") == "retention_days must be a whole number from 1 to 3650"
    )
    assert field_error(response.text, "send_window.start") == "start must be a 24-hour time HH:MM"
    assert "start and end must differ" in response.text


def test_publish_warns_about_each_placeholder_without_a_fallback(client) -> None:
    sequence_id = new_sequence(
        client,
        message_step(text='Hi {{contact.name | "there"}}, your plan {{vars.plan}} ({{contact.phone}})'),
        message_step(text="Reminder at {{anchor.time}}", anchor_offset_seconds=-3600),
        message_step(text="{{contact.attributes.city}} on {{anchor.date}}", delay_seconds=60),
    )
    response = client.post(f"/v1/sequences/{sequence_id}/publish")
    assert response.status_code == 201, response.text
    warnings = [(w["field"], w["placeholder"], w["skip_reason"]) for w in response.json()["warnings"]]
    # contact.phone is always there, a fallback guards contact.name, a reminder has its anchor
    assert warnings == [
        ("definition.steps.0.text", "vars.plan", "missing_variable"),
        ("definition.steps.2.text", "contact.attributes.city", "missing_variable"),
        ("definition.steps.2.text", "anchor.date", "missing_anchor"),
    ]
    assert '{{vars.plan | "..."}}' in response.json()["warnings"][0]["message"]
    # publishing the same draft again answers the same version with the same warnings
    again = client.post(f"/v1/sequences/{sequence_id}/publish")
    assert again.status_code == 200 and again.json()["warnings"] == response.json()["warnings"]
    clean = new_sequence(client, message_step(text='Hi {{vars.plan | "friend"}}'))
    assert client.post(f"/v1/sequences/{clean}/publish").json()["warnings"] == []


def test_the_builder_shows_the_warnings_on_their_step(signed_in) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Hi")
    add_step(client, token, sequence_id, text="Your plan: {{vars.plan}}")
    builder = client.get(f"/app/sequences/{sequence_id}").text
    first, second = builder.split('id="f-definition-steps-1"')
    assert "step-warning" not in first.split('id="f-definition-steps-0"')[1]
    assert "{{vars.plan}} has no fallback" in second.split("</li>")[0]
