"""The builder's step form: only the ``only_if`` conditions a step at its place may have, every step
kind (a reminder is a message timed from the anchor), and the preview beside the text."""

from __future__ import annotations

import re

from tests.dashboard_helpers import add_step, draft_of_steps, make_sequence_via_form


def only_if_offered(page: str) -> list[str]:
    return re.findall(r'name="only_if" value="([a-z_]+)"', page)


def kinds_offered(page: str) -> list[str]:
    select = page.split('name="kind"')[1].split("</select>")[0]
    return re.findall(r'<option value="([a-z]+)"', select)


def test_the_first_step_is_offered_only_the_conditions_it_may_have(signed_in) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    first = client.get(f"/app/sequences/{sequence_id}/steps/new").text
    assert only_if_offered(first) == ["no_reply_since_enrollment"]
    assert kinds_offered(first) == ["message", "ai", "reminder"]
    add_step(client, token, sequence_id, text="One")
    second = client.get(f"/app/sequences/{sequence_id}/steps/new").text
    assert only_if_offered(second) == [
        "no_reply_since_previous_step",
        "no_reply_since_enrollment",
        "previous_not_read",
    ]
    # editing the first step offers what the first step may have, too
    assert only_if_offered(client.get(f"/app/sequences/{sequence_id}/steps/0").text) == [
        "no_reply_since_enrollment"
    ]


def test_a_reminder_is_saved_as_a_message_timed_from_the_anchor(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    form = client.get(f"/app/sequences/{sequence_id}/steps/new?kind=reminder").text
    assert re.search(r'<option value="reminder" selected>', form)
    assert 'name="timing" value="wait"' not in form  # a reminder is timed from the anchor only
    data = {
        "_csrf": token,
        "_op": "save",
        "kind": "reminder",
        "text": "See you at {{anchor.time}}",
        "offset_value": "2",
        "offset_unit": "hours",
        "offset_direction": "before",
        "grace_value": "30",
        "grace_unit": "minutes",
    }
    saved = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data, follow_redirects=False)
    assert saved.status_code == 303, saved.text
    (step,) = draft_of_steps(runtime.pool, sequence_id)
    assert (step["kind"], step["anchor_offset_seconds"], step["grace_seconds"]) == ("message", -7200, 1800)
    assert "delay_seconds" not in step or step["delay_seconds"] == 0
    edit = client.get(f"/app/sequences/{sequence_id}/steps/0").text
    assert re.search(r'<option value="reminder" selected>', edit)
    # switching a reminder to a message gives it a wait again
    data |= {"_op": "refresh", "kind": "message"}
    refreshed = client.post(f"/app/sequences/{sequence_id}/steps/0", data=data).text
    assert re.search(r'name="timing" value="wait" checked', refreshed)


def test_the_preview_sits_beside_the_text_in_the_page(signed_in) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    form = client.get(f"/app/sequences/{sequence_id}/steps/new").text
    editor = form.split('<div class="step-editor">')[1].split("<legend>When</legend>")[0]
    assert 'name="text"' in editor and 'id="step-preview"' in editor


def test_a_steps_category_is_chosen_kept_and_left_to_its_sequence_by_default(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    data = {"_csrf": token, "_op": "save", "kind": "message", "text": "Your order", "category": "utility"}
    saved = client.post(f"/app/sequences/{sequence_id}/steps/new", data=data, follow_redirects=False)
    assert saved.status_code == 303, saved.text
    add_step(client, token, sequence_id, text="Promo")
    first, second = draft_of_steps(runtime.pool, sequence_id)
    assert (first["category"], second.get("category")) == ("utility", None)
    edit = client.get(f"/app/sequences/{sequence_id}/steps/0").text
    assert re.search(r'<option value="utility" selected>', edit)
