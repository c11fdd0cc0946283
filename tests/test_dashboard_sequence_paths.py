"""The builder's paths over HTTP: a branch (its paths' conditions from the condition builder, read or not),
a wait for a reply and a split with a holdout, added and edited through their forms; a step's id and
``next``; the tree the builder draws; the definition's errors next to the field they name."""

from __future__ import annotations

import html
import re
from typing import Any

from tests.dashboard_helpers import add_step, draft_of_steps, errors_on, field_error, make_sequence_via_form
from tests.helpers import rows


def text_of(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def post_step(client: Any, token: str, sequence_id: str, step: str = "new", **fields: Any) -> Any:
    """Save the step form (``step``: an index, or ``new``)."""
    return client.post(
        f"/app/sequences/{sequence_id}/steps/{step}",
        data={"_csrf": token, "_op": "save", **fields},
        follow_redirects=False,
    )


BRANCH = {
    "kind": "branch",
    "id": "route",
    "wait_value": "1",
    "wait_unit": "hours",
    "paths.0.name": "ada",
    "paths.0.to": "vip",
    "paths.0.read": "false",
    "paths.0.when.kind": "all",
    "paths.0.when.all.0.attribute": "contact.name",
    "paths.0.when.all.0.operator": "equal_to",
    "paths.0.when.all.0.value": "Ada",
    "paths.0.when.all.0.type": "text",
    "otherwise": "rest",
}


def test_a_branch_is_added_before_its_targets_and_drawn_as_a_tree(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Hi")
    add_step(client, token, sequence_id, text="VIP offer", id="vip", next="end")
    add_step(client, token, sequence_id, text="Regular", id="rest")
    # the form of a new branch placed before step 2 offers the later steps' ids as targets
    form = client.get(f"/app/sequences/{sequence_id}/steps/new?kind=branch&at=1").text
    assert '<option value="vip">step 3 · vip</option>' in form and 'name="at" value="1"' in form
    # "Add condition" draws the form again with one more condition, and saves nothing
    more = client.post(
        f"/app/sequences/{sequence_id}/steps/new",
        data={"_csrf": token, "at": "1", **BRANCH, "_op": "add_leaf:paths.0.when"},
    )
    assert more.status_code == 200 and 'name="paths.0.when.all.1.attribute"' in more.text
    assert len(draft_of_steps(runtime.pool, sequence_id)) == 3

    saved = post_step(client, token, sequence_id, **BRANCH, at="1")

    assert saved.status_code == 303, errors_on(saved.text)
    steps = draft_of_steps(runtime.pool, sequence_id)
    assert [s.get("id") for s in steps] == [None, "route", "vip", "rest"]
    assert steps[1]["delay_seconds"] == 3600 and steps[1]["otherwise"] == "rest"
    assert steps[1]["paths"] == [
        {
            "name": "ada",
            "when": {"all": [{"attribute": "contact.name", "operator": "equal_to", "value": "Ada"}]},
            "read": False,
            "to": "vip",
        }
    ]
    builder = text_of(client.get(f"/app/sequences/{sequence_id}").text)
    assert "Step 2 · Branch · route" in builder
    ada = 'Path ada: when Contact\'s name equal to "Ada"; the previous follow-up was not read'
    ada += " Step 3 · Message · vip"
    assert ada in builder
    assert (
        "VIP offer Ends: the enrollment completes. Otherwise (no path holds) Step 4 · Message · rest"
        in builder
    )
    assert "1h after the previous step, takes the first path whose conditions hold." in builder
    # its edit form shows what is stored
    edit = client.get(f"/app/sequences/{sequence_id}/steps/1").text
    assert 'name="paths.0.when.all.0.value" value="Ada"' in edit
    assert re.search(r'name="paths.0.read"[^>]*>.*?<option value="false" selected>', edit, re.S)


def test_a_branchs_errors_are_shown_next_to_their_fields(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="VIP", id="vip")
    bad = BRANCH | {"paths.0.name": "Bad Name", "otherwise": "", "wait_value": "soon"}
    refused = post_step(client, token, sequence_id, **bad, at="0")
    assert refused.status_code == 422
    assert "lowercase" in field_error(refused.text, "paths.0.name")
    assert "whole number" in field_error(refused.text, "delay_seconds")
    event = BRANCH | {
        "paths.0.when.all.0.attribute": "message.type",
        "otherwise": "",
    }  # a branch has no event
    refused = post_step(client, token, sequence_id, **event, at="0")
    assert refused.status_code == 422
    assert "a segment has no event" in field_error(refused.text, "paths.0.when.all.0.attribute")
    assert len(draft_of_steps(runtime.pool, sequence_id)) == 1
    # a target removed afterwards: saving the branch again names its path's target
    assert post_step(client, token, sequence_id, **(BRANCH | {"otherwise": ""}), at="0").status_code == 303
    client.post(f"/app/sequences/{sequence_id}/steps/1/remove", data={"_csrf": token})
    builder = client.get(f"/app/sequences/{sequence_id}").text
    assert "Goes to an id no later step has: choose another." in builder
    published = client.post(f"/app/sequences/{sequence_id}/publish", data={"_csrf": token})
    assert "paths.0.to: no step has the id vip" in text_of(published.text)
    edit = client.get(f"/app/sequences/{sequence_id}/steps/0").text
    assert '<option value="vip" selected>vip (no later step has this id)</option>' in edit
    again = post_step(client, token, sequence_id, step="0", **(BRANCH | {"otherwise": ""}))
    assert again.status_code == 422
    assert field_error(again.text, "paths.0.to") == "no step has the id vip"


def test_a_wait_for_a_reply_has_its_reply_and_timeout_paths(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Hi")
    add_step(client, token, sequence_id, text="Thanks!", id="thanks")
    wait = {
        "kind": "wait_for_reply",
        "wait_value": "2",
        "wait_unit": "days",
        "on_reply": "thanks",
        "on_timeout": "end",
    }
    refused = post_step(client, token, sequence_id, **(wait | {"wait_value": ""}), at="1")
    assert refused.status_code == 422 and "required" in field_error(refused.text, "timeout_seconds")

    saved = post_step(client, token, sequence_id, **wait, at="1")

    assert saved.status_code == 303, errors_on(saved.text)
    step = draft_of_steps(runtime.pool, sequence_id)[1]
    assert (step["kind"], step["timeout_seconds"], step["on_reply"], step["on_timeout"]) == (
        "wait_for_reply",
        172800,
        "thanks",
        "end",
    )
    builder = text_of(client.get(f"/app/sequences/{sequence_id}").text)
    assert "Waits up to 2d for the contact's reply." in builder
    assert "Replied within 2d Step 3 · Message · thanks" in builder
    assert "No reply within 2d Ends: the enrollment completes." in builder


def test_a_split_with_a_holdout_and_a_winner(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Warm", id="warm", next="end")
    add_step(client, token, sequence_id, text="Short", id="short")
    form = client.get(f"/app/sequences/{sequence_id}/steps/new?kind=split&at=0").text
    assert 'name="variants.1.name" value="b"' in form  # two variants to start with
    split = {
        "kind": "split",
        "experiment": "tone",
        "wait_value": "0",
        "variants.0.name": "warm",
        "variants.0.weight": "2",
        "variants.0.to": "warm",
        "variants.1.name": "short",
        "variants.1.weight": "1",
        "variants.1.to": "short",
        "holdout_weight": "1",
        "at": "0",
    }
    added = client.post(
        f"/app/sequences/{sequence_id}/steps/new", data={"_csrf": token, **split, "_op": "add_variant"}
    )
    assert 'name="variants.2.name"' in added.text
    removed = client.post(
        f"/app/sequences/{sequence_id}/steps/new", data={"_csrf": token, **split, "_op": "remove_variant:1"}
    )
    assert 'name="variants.1.name"' not in removed.text
    one = {k: v for k, v in split.items() if not k.startswith("variants.1")} | {"holdout_weight": "0"}
    refused = post_step(client, token, sequence_id, **one)
    assert refused.status_code == 422
    assert "a split needs two variants, or one and a holdout" in errors_on(refused.text)

    saved = post_step(client, token, sequence_id, **split)

    assert saved.status_code == 303, errors_on(saved.text)
    step = draft_of_steps(runtime.pool, sequence_id)[0]
    assert step["variants"] == [
        {"name": "warm", "weight": 2, "to": "warm"},
        {"name": "short", "weight": 1, "to": "short"},
    ]
    assert step["holdout_weight"] == 1 and step["experiment"] == "tone"
    builder = text_of(client.get(f"/app/sequences/{sequence_id}").text)
    assert "Variant warm · weight 2 · 50 % Step 2 · Message · warm" in builder
    assert "Variant short · weight 1 · 25 % Step 3 · Message · short" in builder
    assert "Holdout (holdout) · weight 1 · 25 %: sent nothing more Ends: the enrollment completes." in builder
    # choosing a winner
    chosen = post_step(client, token, sequence_id, step="0", **(split | {"winner": "short"}))
    assert chosen.status_code == 303, errors_on(chosen.text)
    assert draft_of_steps(runtime.pool, sequence_id)[0]["winner"] == "short"
    assert "Variant short · weight 1 · 25 % · winner" in text_of(
        client.get(f"/app/sequences/{sequence_id}").text
    )


def test_a_sending_steps_id_and_next_are_saved_and_checked(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="One", next="end")
    add_step(client, token, sequence_id, text="Two", id="two")
    assert [(s.get("id"), s.get("next")) for s in draft_of_steps(runtime.pool, sequence_id)] == [
        (None, "end"),
        ("two", None),
    ]
    edit = client.get(f"/app/sequences/{sequence_id}/steps/0").text
    assert '<option value="two">step 2 · two</option>' in edit
    data = {"kind": "message", "text": "One", "timing": "wait", "wait_value": "0", "wait_unit": "hours"}
    taken = post_step(client, token, sequence_id, step="0", **data, id="two")
    assert taken.status_code == 422 and field_error(taken.text, "id") == "id two is already step 2's"
    bad = post_step(client, token, sequence_id, step="0", **data, id="End")
    assert bad.status_code == 422 and "lowercase" in field_error(bad.text, "id")
    builder = text_of(client.get(f"/app/sequences/{sequence_id}").text)
    assert "No path reaches these steps" in builder  # step 1 ends, so step 2 is reached by no path


def criteria(token: str, **fields: str) -> dict[str, str]:
    """The goals and exits form: a goal ``won`` (a lead's status changed to won), an exit ``revoked`` (the
    contact's consent revoked) that blocks entry, a 3-day window."""
    return {
        "_csrf": token,
        "_op": "save",
        "definition.goals.0.name": "won",
        "definition.goals.0.event": "lead.status_changed",
        "definition.goals.0.conditions.kind": "all",
        "definition.goals.0.conditions.all.0.attribute": "lead.status",
        "definition.goals.0.conditions.all.0.operator": "equal_to",
        "definition.goals.0.conditions.all.0.value": "won",
        "definition.goals.0.conditions.all.0.type": "text",
        "definition.exits.0.name": "revoked",
        "definition.exits.0.event": "contact.updated",
        "definition.exits.0.conditions.kind": "all",
        "definition.exits.0.conditions.all.0.attribute": "contact.consent",
        "definition.exits.0.conditions.all.0.operator": "equal_to",
        "definition.exits.0.conditions.all.0.value": "revoked",
        "definition.exits.0.conditions.all.0.type": "text",
        "definition.exits.0.blocks_entry": "on",
        "window_value": "3",
        "window_unit": "days",
        **fields,
    }


def test_goals_exits_and_the_conversion_window_are_edited_on_the_sequence_page(signed_in, runtime) -> None:
    client, token = signed_in
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Hi")
    url = f"/app/sequences/{sequence_id}/criteria"
    added = client.post(url, data=criteria(token, _op="add_goal"))
    assert added.status_code == 200 and 'name="definition.goals.1.name"' in added.text

    saved = client.post(url, data=criteria(token), follow_redirects=False)

    assert saved.status_code == 303, errors_on(saved.text)
    draft = rows_of_draft(runtime, sequence_id)
    assert draft["goals"] == [
        {
            "name": "won",
            "event": "lead.status_changed",
            "conditions": {"all": [{"attribute": "lead.status", "operator": "equal_to", "value": "won"}]},
        }
    ]
    assert draft["exits"][0]["blocks_entry"] is True and draft["exits"][0]["event"] == "contact.updated"
    assert draft["conversion_window_seconds"] == 3 * 86400
    page = client.get(f"/app/sequences/{sequence_id}").text
    assert 'name="definition.goals.0.conditions.all.0.value" value="won"' in page
    assert 'name="definition.exits.0.blocks_entry" checked' in page
    # an exit that blocks entry names no event attribute; goals' names are unique; the window is bounded
    bad = criteria(
        token,
        **{
            "definition.exits.0.conditions.all.0.attribute": "message.type",
            "definition.goals.1.name": "won",
            "definition.goals.1.event": "contact.updated",
            "window_value": "100",
        },
    )
    refused = client.post(url, data=bad)
    assert refused.status_code == 422
    assert "a segment has no event" in field_error(
        refused.text, "definition.exits.0.conditions.all.0.attribute"
    )
    assert field_error(refused.text, "definition.goals.1.name") == "goal won is named twice"
    assert "7776000" in field_error(refused.text, "definition.conversion_window_seconds")
    assert rows_of_draft(runtime, sequence_id)["conversion_window_seconds"] == 3 * 86400  # nothing saved
    removed = client.post(url, data=criteria(token, _op="remove:definition.exits.0"))
    assert 'name="definition.exits.0.name"' not in removed.text


def rows_of_draft(runtime: Any, sequence_id: str) -> dict[str, Any]:
    draft: dict[str, Any] = rows(
        runtime.pool, "SELECT draft FROM followup_sequences WHERE id = %s", sequence_id
    )[0][0]
    return draft
