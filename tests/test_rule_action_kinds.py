"""An action is one class: its fields (with the dashboard's label of each), its validation and its run; the
tagged union is built from them and the rule form's inputs are derived from them. A send-message action
renders through ``render_message``: a text its values make too long is a refused rule, never a truncated
message."""

from __future__ import annotations

from typing import Any, get_type_hints

import msgspec
import pytest
from litestar.testing import TestClient

from libs.common.contracts.limits import MAX_MESSAGE_LENGTH
from libs.common.core.runtime import Runtime
from libs.common.rules.actions import ACTION_KINDS, Action, BaseAction, action_type
from services.api.dashboard.action_form import (
    ACTION_CHOICES,
    ACTION_FIELDS,
    ACTION_TYPES,
    action_json,
    action_row,
    inputs_of,
)
from services.api.dashboard.forms import FormErrors
from tests.conftest import csrf_of
from tests.rule_helpers import create_rule, process
from tests.rule_trigger_helpers import add_tags, new_contact, rule_messages, runs

KINDS = [pytest.param(kind, id=str(kind.__struct_config__.tag)) for kind in ACTION_KINDS]


def _form_meta(kind: type[BaseAction], name: str) -> dict[str, Any]:
    hint = get_type_hints(kind, include_extras=True)[name]
    extras = [m.extra for m in getattr(hint, "__metadata__", ()) if isinstance(m, msgspec.Meta) and m.extra]
    found: dict[str, Any] = next((extra["form"] for extra in extras if "form" in extra), {})
    return found


def test_the_union_is_the_action_kinds_each_with_its_own_tag() -> None:
    tags = [kind.__struct_config__.tag for kind in ACTION_KINDS]
    assert len(tags) == len(set(tags)) == 13
    assert tags == ACTION_TYPES
    decoded = msgspec.convert([{"type": "add_label", "labels": ["vip"]}], list[Action])
    assert [action_type(a) for a in decoded] == ["add_label"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_runs_itself(kind: type[BaseAction]) -> None:
    assert kind.run is not BaseAction.run, f"{kind.__name__} has no run of its own"


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_of_every_kind_has_a_labelled_form_input(kind: type[BaseAction]) -> None:
    """Fails when an action (or one of its fields) has no input on the dashboard's rule form."""
    tag = str(kind.__struct_config__.tag)
    assert tag in ACTION_FIELDS, f"{tag} has no form fields"
    names = {item.name for item in ACTION_FIELDS[tag]}
    for info in msgspec.structs.fields(kind):
        meta = _form_meta(kind, info.name)
        assert meta.get("label"), f"{tag}.{info.name} has no form label"
        covered = {name for name in names if name == info.name or name.startswith(f"{info.name}.")}
        assert covered, f"{tag}.{info.name} has no form input"
    for item in ACTION_FIELDS[tag]:
        assert item.label
        assert item.widget in ("text", "textarea", "list") or item.widget.startswith("select:")
        if item.widget.startswith("select:") and item.widget != "select:sequences":
            assert ACTION_CHOICES[item.widget.removeprefix("select:")] == list(item.choices)
    assert inputs_of(kind) == ACTION_FIELDS[tag]


def test_the_form_inputs_are_the_ones_the_form_always_had() -> None:
    shown = {kind: [(i.name, i.label, i.widget) for i in items] for kind, items in ACTION_FIELDS.items()}
    assert shown["send_message"] == [
        ("text", "Message", "textarea"),
        ("whatsapp_template.name", "WhatsApp template name (optional)", "text"),
        ("whatsapp_template.language", "Template language", "text"),
        ("whatsapp_template.parameters", "Template parameters (one a line)", "textarea"),
        ("category", "Category", "select:send_message.category"),
    ]
    assert shown["enroll_in_sequence"][0] == ("sequence_id", "Sequence", "select:sequences")
    assert shown["add_label"] == [("labels", "Labels (comma separated)", "list")]
    assert ACTION_CHOICES["change_status.status"] == [
        (s, s) for s in ("open", "pending", "snoozed", "resolved")
    ]
    assert ACTION_CHOICES["change_priority.priority"] == [
        ("", "none"),
        *[(p, p) for p in ("low", "medium", "high", "urgent")],
    ]


#: One action of every kind, as the API takes it.
SAMPLES: list[dict[str, Any]] = [
    {
        "type": "enroll_in_sequence",
        "sequence_id": "6f1c1f4e-8a55-4d4f-9a55-2b0f3c1d2e3f",
        "anchor": "contact.attributes.appointment_at",
        "variables": {"plan": "gold"},
    },
    {
        "type": "send_message",
        "text": "Hi {{ contact.name }}",
        "whatsapp_template": {"name": "welcome", "language": "pt_BR", "parameters": ["a", "b"]},
    },
    {"type": "add_label", "labels": ["vip", "lead"]},
    {"type": "remove_label", "labels": ["cold"]},
    {"type": "add_contact_tag", "tags": ["seen"]},
    {"type": "remove_contact_tag", "tags": ["new", "old"]},
    {"type": "assign_agent", "assignee": "ana"},
    {"type": "assign_team", "team": None},
    {"type": "change_status", "status": "snoozed"},
    {"type": "change_priority", "priority": "urgent"},
    {"type": "snooze_until", "minutes": 90},
    {"type": "add_private_note", "text": "called, no answer"},
    {"type": "send_webhook", "url": "https://example.com/hook"},
]


def test_the_samples_cover_every_kind() -> None:
    assert [sample["type"] for sample in SAMPLES] == ACTION_TYPES


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["type"] for s in SAMPLES])
def test_a_stored_action_drawn_on_the_form_and_posted_back_is_the_same_action(sample: dict[str, Any]) -> None:
    stored = msgspec.convert(sample, Action)
    errors = FormErrors()
    posted = action_json(action_row(msgspec.to_builtins(stored)), "actions.0", errors)
    assert not errors
    assert msgspec.convert(posted, Action) == stored


def test_a_template_without_a_name_is_left_out_and_an_empty_anchor_is_none() -> None:
    row = action_row({"type": "send_message", "text": "Hi"})
    assert row.fields == {
        "text": "Hi",
        "whatsapp_template.name": "",
        "whatsapp_template.language": "",
        "whatsapp_template.parameters": "",
        "category": "",
    }
    # an empty category is the field's default
    assert action_json(row, "actions.0", FormErrors()) == {
        "type": "send_message",
        "text": "Hi",
        "category": "marketing",
    }
    enroll = action_row({"type": "enroll_in_sequence", "sequence_id": "x", "anchor": ""})
    assert action_json(enroll, "actions.0", FormErrors())["anchor"] == "none"


@pytest.mark.parametrize("kind", ACTION_TYPES)
def test_the_rule_form_draws_every_input_of_every_kind(signed_in: Any, kind: str) -> None:
    client, token = signed_in
    page = client.post(
        "/app/rules/new",
        data={
            "_csrf": token,
            "name": "r",
            "event": "contact.created",
            "actions.0.type": kind,
            "_op": "redraw",
        },
    )
    assert page.status_code == 200
    csrf_of(page.text)
    for item in ACTION_FIELDS[kind]:
        assert f'name="actions.0.{item.name}"' in page.text, (kind, item.name)


def test_a_message_its_values_make_too_long_is_refused_not_truncated(
    client: TestClient[Any], runtime: Runtime
) -> None:
    rule = create_rule(
        client, "contact.tag_added", [{"type": "send_message", "text": "{{ contact.attributes.bio }}!"}]
    )
    long_bio = new_contact(client, attributes={"bio": "b" * MAX_MESSAGE_LENGTH})
    add_tags(client, long_bio, "go")
    assert process(runtime) == 1
    assert runs(client, rule) == [("rejected", "message_too_long")]
    assert rule_messages(runtime, long_bio) == []

    fits = new_contact(client, attributes={"bio": "b" * (MAX_MESSAGE_LENGTH - 1)})
    add_tags(client, fits, "go")
    assert process(runtime) == 1
    assert runs(client, rule)[-1] == ("executed", None)
    [message] = rule_messages(runtime, fits)
    assert message["body"] == "b" * (MAX_MESSAGE_LENGTH - 1) + "!"
