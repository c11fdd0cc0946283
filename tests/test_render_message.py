"""One ``render_message``: a message's text rendered with the length limit, the same for a step at release,
a rule's send-message action (tests/test_rule_actions.py) and the dashboard's step preview."""

from __future__ import annotations

from typing import Any

from libs.common.contracts.limits import MAX_MESSAGE_LENGTH
from libs.common.followups.templates import TOO_LONG_REASON, RenderContext, render, render_message
from tests.dashboard_helpers import draft_of_steps, make_sequence_via_form
from tests.factories import make_contact


def context(**variables: Any) -> RenderContext:
    return RenderContext(
        variables=variables,
        anchor_at=None,
        timezone=None,
        fallback_timezone="UTC",
        contact_name="Ada",
        contact_phone="+15550000000",
        contact_attributes={},
    )


def test_a_text_within_the_limit_renders_as_render_does() -> None:
    text = "Hi {{contact.name}}, order {{vars.order}}"
    assert render_message(text, context(order=42)) == render(text, context(order=42))
    assert render_message(text, context(order=42)).text == "Hi Ada, order 42"


def test_a_text_of_exactly_the_limit_once_filled_in_is_sent() -> None:
    filler = "x" * (MAX_MESSAGE_LENGTH - len("Hi Ada"))
    rendered = render_message("Hi {{contact.name}}{{vars.filler}}", context(filler=filler))
    assert rendered.text == "Hi Ada" + filler
    assert rendered.text is not None and len(rendered.text) == MAX_MESSAGE_LENGTH


def test_a_text_its_values_make_too_long_is_skipped_never_truncated() -> None:
    filler = "x" * (MAX_MESSAGE_LENGTH - len("Hi Ada") + 1)
    rendered = render_message("Hi {{contact.name}}{{vars.filler}}", context(filler=filler))
    assert (rendered.text, rendered.skip_reason) == (None, TOO_LONG_REASON)
    assert TOO_LONG_REASON == "message_too_long"


def test_a_missing_value_is_still_the_first_reason() -> None:
    rendered = render_message("{{vars.missing}}{{vars.filler}}", context(filler="x" * MAX_MESSAGE_LENGTH))
    assert (rendered.text, rendered.skip_reason, rendered.skip_detail) == (
        None,
        "missing_variable",
        "vars.missing",
    )


def test_the_step_preview_says_a_text_too_long_once_filled_in_would_be_skipped(
    signed_in: Any, project: Any, pool: Any
) -> None:
    client, token = signed_in
    long_plan = "p" * MAX_MESSAGE_LENGTH
    contact_id = make_contact(pool, project.id, name="Ada", attributes={"plan": long_plan})
    short = make_contact(pool, project.id, name="Bo", attributes={"plan": "gold"})
    sequence_id = make_sequence_via_form(client, token, "S")
    data = {
        "_csrf": token,
        "kind": "message",
        "timing": "wait",
        "wait_value": "0",
        "wait_unit": "hours",
        "text": "Hi {{contact.name}}, your {{contact.attributes.plan}} plan",
        "preview_contact": str(contact_id),
        "preview_variables": "",
        "_op": "preview",
    }
    too_long = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data)
    assert too_long.status_code == 200
    assert "This step would be skipped (message_too_long)." in too_long.text
    assert long_plan not in too_long.text
    fits = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data | {"preview_contact": str(short)})
    assert '<p class="preview">Hi Bo, your gold plan</p>' in fits.text
    assert draft_of_steps(pool, sequence_id) == []
