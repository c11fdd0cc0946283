"""The dashboard's sequence builder over HTTP: steps, publish, versions and what changed,
pause / resume / archive, and the preview."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from libs.common.core.runtime import Runtime
from tests.dashboard_helpers import add_step, draft_of_steps, field_error, make_sequence_via_form, publish
from tests.factories import make_contact
from tests.helpers import rows

# --- sequences ----------------------------------------------------------------------------------------------


def draft_of(runtime: Runtime, sequence_id: str) -> dict[str, Any]:
    draft: dict[str, Any] = rows(
        runtime.pool, "SELECT draft FROM followup_sequences WHERE id = %s", sequence_id
    )[0][0]
    return draft


def test_the_builder_adds_edits_reorders_and_removes_steps(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "Onboarding")
    add_step(client, token, sequence_id, text="Hi {{contact.name}}")
    add_step(
        client,
        token,
        sequence_id,
        text="Any questions?",
        wait_value="2",
        wait_unit="days",
        only_if="no_reply_since_previous_step",
    )
    add_step(
        client,
        token,
        sequence_id,
        timing="anchor",
        text="See you at {{anchor.time}}",
        offset_value="2",
        offset_unit="hours",
        offset_direction="before",
        grace_value="30",
        grace_unit="minutes",
        window="on",
        **{"send_window.start": "09:00", "send_window.end": "18:00", "send_window.days": "mon"},
    )
    add_step(
        client,
        token,
        sequence_id,
        kind="ai",
        instructions="Ask politely",
        goal="help",
        language="pt_BR",
        **{"fallback.kind": "skip", "min_confidence": "0.7"},
    )
    # changing the kind draws the form again for the new kind, and saves nothing
    redrawn = client.post(
        f"/app/sequences/{sequence_id}/steps/new",
        data={"_csrf": token, "kind": "ai", "text": "kept?", "timing": "wait", "_op": "refresh"},
    )
    assert redrawn.status_code == 200 and 'name="instructions"' in redrawn.text
    steps = draft_of(runtime, sequence_id)["steps"]
    assert [s["kind"] for s in steps] == ["message", "message", "message", "ai"]
    assert steps[1]["delay_seconds"] == 172800 and steps[1]["only_if"] == ["no_reply_since_previous_step"]
    assert steps[2]["anchor_offset_seconds"] == -7200 and steps[2]["grace_seconds"] == 1800
    assert steps[2]["send_window"] == {"start": "09:00", "end": "18:00", "days": ["mon"]}
    assert steps[3]["fallback"] == {"kind": "skip"} and steps[3]["min_confidence"] == 0.7
    assert steps[3]["language"] == "pt_BR"
    assert 'value="pt_BR"' in client.get(f"/app/sequences/{sequence_id}/steps/3").text
    builder = client.get(f"/app/sequences/{sequence_id}").text
    assert "Wait 2d after the previous step" in builder and "2h before the anchor" in builder
    # edit the first step: its form shows what is stored
    edit = client.get(f"/app/sequences/{sequence_id}/steps/0").text
    assert "Hi {{contact.name}}</textarea>" in edit
    response = client.post(
        f"/app/sequences/{sequence_id}/steps/0",
        data={
            "_csrf": token,
            "kind": "message",
            "text": "Hello!",
            "timing": "wait",
            "wait_value": "5",
            "wait_unit": "minutes",
            "_op": "save",
        },
        follow_redirects=False,
    )
    assert response.status_code == 303
    assert draft_of(runtime, sequence_id)["steps"][0]["text"] == "Hello!"
    assert draft_of(runtime, sequence_id)["steps"][0]["delay_seconds"] == 300
    # reorder and remove
    client.post(f"/app/sequences/{sequence_id}/steps/3/move", data={"_csrf": token, "direction": "up"})
    assert [s["kind"] for s in draft_of(runtime, sequence_id)["steps"]] == [
        "message",
        "message",
        "ai",
        "message",
    ]
    client.post(f"/app/sequences/{sequence_id}/steps/0/move", data={"_csrf": token, "direction": "down"})
    assert draft_of(runtime, sequence_id)["steps"][1]["text"] == "Hello!"
    client.post(f"/app/sequences/{sequence_id}/steps/2/remove", data={"_csrf": token})
    assert [s["kind"] for s in draft_of(runtime, sequence_id)["steps"]] == ["message", "message", "message"]
    assert (
        client.post(f"/app/sequences/{sequence_id}/steps/7/remove", data={"_csrf": token}).status_code == 404
    )
    assert (
        client.post(
            f"/app/sequences/{sequence_id}/steps/0/move", data={"_csrf": token, "direction": "up"}
        ).status_code
        == 404
    )


@pytest.mark.parametrize(
    ("fields", "name", "message"),
    [
        ({"text": "  "}, "text", "text must not be empty"),
        ({"text": "Hi {{vars.x"}, "text", "unclosed placeholder"),
        ({"text": "Hi {{name}}"}, "text", ""),
        ({"wait_value": "-1"}, "delay_seconds", "a whole number from 0 to 31622400"),
        ({"wait_value": "soon"}, "delay_seconds", "whole number"),
        ({"only_if": "no_reply_since_previous_step"}, "only_if", "the first step has no previous step"),
        (
            {
                "window": "on",
                "send_window.start": "25:00",
                "send_window.end": "10:00",
                "send_window.days": "mon",
            },
            "send_window.start",
            "24-hour time",
        ),
        ({"media_url": "ftp://x", "media_kind": "image"}, "media_url", "http or https"),
        ({"whatsapp_template.name": "Bad Name"}, "whatsapp_template.name", "lowercase"),
        (
            {"kind": "ai", "instructions": "x", "min_confidence": "2"},
            "min_confidence",
            "a number from 0 to 1",
        ),
        ({"kind": "ai", "instructions": "x", "language": "Portuguese"}, "language", "language code"),
        ({"timing": "anchor", "offset_value": ""}, "anchor_offset_seconds", "required"),
    ],
)
def test_step_errors_are_shown_next_to_their_field(signed_in, runtime, fields, name, message) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    data = {
        "_csrf": token,
        "kind": "message",
        "text": "ok",
        "timing": "wait",
        "wait_value": "0",
        "wait_unit": "hours",
        "_op": "save",
    } | fields
    response = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data)
    assert response.status_code == 422
    assert message in field_error(response.text, name)
    assert draft_of(runtime, sequence_id).get("steps", []) == []


def test_publish_creates_versions_and_its_errors_name_the_step(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    refused = client.post(f"/app/sequences/{sequence_id}/publish", data={"_csrf": token})
    assert refused.status_code == 422
    assert "a sequence needs at least one step" in refused.text
    add_step(client, token, sequence_id, text="One")
    add_step(client, token, sequence_id, text="Two", only_if="no_reply_since_previous_step")
    publish(client, token, sequence_id)
    assert "Published version v1" in client.get(f"/app/sequences/{sequence_id}").text
    # moving the second step first makes its only-if impossible: publishing says so on that step
    client.post(f"/app/sequences/{sequence_id}/steps/1/move", data={"_csrf": token, "direction": "up"})
    refused = client.post(f"/app/sequences/{sequence_id}/publish", data={"_csrf": token})
    assert refused.status_code == 422
    first_step = refused.text.split('id="f-definition-steps-0"')[1].split("</li>")[0]
    assert "the first step has no previous step" in first_step and 'class="invalid"' in refused.text
    client.post(f"/app/sequences/{sequence_id}/steps/0/move", data={"_csrf": token, "direction": "down"})
    client.post(
        f"/app/sequences/{sequence_id}/steps/1",
        data={
            "_csrf": token,
            "kind": "message",
            "text": "Two, changed",
            "timing": "wait",
            "wait_value": "1",
            "wait_unit": "days",
            "_op": "save",
        },
    )
    publish(client, token, sequence_id)
    assert rows(runtime.pool, "SELECT version FROM followup_sequence_versions ORDER BY version") == [
        (1,),
        (2,),
    ]
    versions = client.get(f"/app/sequences/{sequence_id}/versions").text
    assert "v2" in versions and "(current)" in versions
    changes = client.get(f"/app/sequences/{sequence_id}/versions?from=1&to=2").text
    assert "step 2 · text" in changes and "<del>Two</del>" in changes and "<ins>Two, changed</ins>" in changes
    assert "step 2 · delay seconds" in changes and "<ins>86400</ins>" in changes
    assert "step 2 · only if" in changes


def test_pause_resume_archive(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    conflict = client.post(f"/app/sequences/{sequence_id}/pause", data={"_csrf": token})
    assert conflict.status_code == 409 and "a draft sequence cannot be paused" in conflict.text
    add_step(client, token, sequence_id, text="One")
    publish(client, token, sequence_id)
    for action, status in (("pause", "paused"), ("resume", "active"), ("archive", "archived")):
        response = client.post(f"/app/sequences/{sequence_id}/{action}", data={"_csrf": token})
        assert response.status_code == 200
        assert rows(runtime.pool, "SELECT status FROM followup_sequences") == [(status,)]
    archived = client.get(f"/app/sequences/{sequence_id}").text
    assert "Add message" not in archived and "/publish" not in archived
    assert "archived" in client.get("/app/sequences?status=archived").text


def test_sequence_options_and_rename(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")

    def options(end: str = "12:00", days: Any = ("mon", "tue"), **more: str) -> Any:
        """POST the options form: re-entry never, stop on reply, a send window 08:00 to ``end``."""
        fields = {
            "_csrf": token,
            "definition.reentry": "never",
            "definition.stop_on.reply": "on",
            "window": "on",
            "definition.send_window.start": "08:00",
            "definition.send_window.end": end,
            "definition.send_window.days": list(days) if not isinstance(days, str) else days,
        }
        return client.post(
            f"/app/sequences/{sequence_id}/options", data=fields | more, follow_redirects=False
        )

    response = options(end="08:00", days="mon")
    assert response.status_code == 422
    assert "start and end must differ" in response.text
    response = options(**{"definition.number_id": str(uuid.uuid4())})
    assert response.status_code == 404
    assert field_error(response.text, "definition.number_id") == "number not found"
    response = options()
    assert response.status_code == 303
    draft = draft_of(runtime, sequence_id)
    assert draft["reentry"] == "never"
    assert draft["stop_on"] == {
        "reply": True,
        "human_message": False,
        "opt_out": False,
        "lead_closed": False,
        "conversation_resolved": False,
    }
    assert draft["send_window"] == {"start": "08:00", "end": "12:00", "days": ["mon", "tue"]}
    renamed = client.post(f"/app/sequences/{sequence_id}/rename", data={"_csrf": token, "name": ""})
    assert renamed.status_code == 422 and "1 to 200 characters" in field_error(renamed.text, "name")
    client.post(f"/app/sequences/{sequence_id}/rename", data={"_csrf": token, "name": "Renamed"})
    assert rows(runtime.pool, "SELECT name FROM followup_sequences") == [("Renamed",)]


def test_the_step_preview_renders_for_a_contact_and_says_when_it_would_be_skipped(
    signed_in, project, pool
) -> None:
    client, token = signed_in
    contact_id = make_contact(pool, project.id, name="Ada", attributes={"plan": "gold"})
    nameless = make_contact(pool, project.id)
    sequence_id = make_sequence_via_form(client, token, "S")
    data = {
        "_csrf": token,
        "kind": "message",
        "timing": "wait",
        "wait_value": "0",
        "wait_unit": "hours",
        "text": "Hi {{contact.name}}, your {{contact.attributes.plan}} plan, order {{vars.order}}",
        "preview_contact": str(contact_id),
        "preview_variables": "order=42",
        "_op": "preview",
    }
    shown = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data)
    assert shown.status_code == 200
    assert '<p class="preview">Hi Ada, your gold plan, order 42</p>' in shown.text
    skipped = client.post(
        f"/app/sequences/{sequence_id}/steps/new", data=data | {"preview_contact": str(nameless)}
    )
    assert "This step would be skipped (missing_variable:contact.name)." in skipped.text
    no_vars = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data | {"preview_variables": ""})
    assert "This step would be skipped (missing_variable:vars.order)." in no_vars.text
    anchor = client.post(
        f"/app/sequences/{sequence_id}/steps/new",
        data=data
        | {"text": "See you {{anchor.weekday}} at {{anchor.time}}", "preview_anchor": "2025-03-07T14:30"},
    )
    assert '<p class="preview">See you Friday at 14:30</p>' in anchor.text
    assert draft_of_steps(pool, sequence_id) == []  # previewing saves nothing
