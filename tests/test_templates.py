"""Message templates: placeholders, time zones, skip reasons, fallbacks and publish-time rejections."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest

from libs.common.core.reasons import stored
from libs.common.followups.templates import (
    RenderContext,
    Rendered,
    Template,
    TemplateError,
    parse_template,
    render,
)

#: 2030-01-15 is a Tuesday.
ANCHOR = datetime(2030, 1, 15, 13, 0, tzinfo=UTC)


def context(**changes: Any) -> RenderContext:
    base = RenderContext(
        variables={"first_name": "Ana", "order": {"id": 42, "paid": True}},
        anchor_at=ANCHOR,
        timezone=None,
        fallback_timezone="UTC",
        contact_name="Ana Souza",
        contact_phone="+5511999990000",
        contact_attributes={"plan": "pro", "address": {"city": "Recife"}},
    )
    return msgspec.structs.replace(base, **changes)


def text(source: str, **changes: Any) -> str | None:
    rendered = render(source, context(**changes))
    assert rendered.skip_reason is None, rendered
    return rendered.text


def skipped(source: str, **changes: Any) -> str:
    """The reason and its detail, as a step run stores them (``missing_variable:vars.b``)."""
    rendered = render(source, context(**changes))
    assert rendered.text is None and rendered.skip_reason is not None, rendered
    return stored(rendered.skip_reason, rendered.skip_detail)


# --- placeholder kinds ---------------------------------------------------------------------------------


def test_a_variable_renders() -> None:
    assert text("Hi {{vars.first_name}}!") == "Hi Ana!"


def test_a_nested_variable_renders() -> None:
    assert text("Order {{ vars.order.id }}") == "Order 42"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ("", ""),
        (7, "7"),
        (-3, "-3"),
        (2.5, "2.5"),
        (0, "0"),
        (True, "true"),
        (False, "false"),
    ],
)
def test_scalar_values_render_as_text(value: Any, expected: str) -> None:
    assert text("[{{vars.x}}]", variables={"x": value}) == f"[{expected}]"


def test_a_value_is_never_expanded_again() -> None:
    assert text("{{vars.x}}", variables={"x": "{{vars.y}}", "y": "no"}) == "{{vars.y}}"


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("date", "2030-01-15"),
        ("time", "13:00"),
        ("datetime", "2030-01-15 13:00"),
        ("weekday", "Tuesday"),
    ],
)
def test_anchor_fields_render_in_utc_by_default(field: str, expected: str) -> None:
    assert text(f"{{{{anchor.{field}}}}}") == expected


def test_contact_fields_render() -> None:
    source = (
        "{{contact.name}} {{contact.phone}} {{contact.attributes.plan}} {{contact.attributes.address.city}}"
    )
    assert text(source) == "Ana Souza +5511999990000 pro Recife"


def test_text_without_placeholders_is_kept_as_is() -> None:
    source = "Hello, see you soon. {braces} } { are fine"
    assert parse_template(source).placeholders() == []
    assert render(source, context()) == Rendered(text=source, skip_reason=None)


def test_an_empty_template_renders_empty() -> None:
    assert text("") == ""


def test_a_repeated_placeholder_renders_each_time_and_is_listed_once() -> None:
    template = parse_template(
        "{{vars.first_name}}, {{ vars.first_name }}! {{anchor.date}} {{vars.first_name}}"
    )
    assert template.placeholders() == ["vars.first_name", "anchor.date"]
    assert render(template, context()).text == "Ana, Ana! 2030-01-15 Ana"


def test_adjacent_placeholders_render() -> None:
    assert text("{{vars.first_name}}{{contact.phone}}") == "Ana+5511999990000"


def test_whitespace_inside_braces_is_allowed() -> None:
    assert text('{{   vars.first_name   }} {{\tcontact.name\t|\t"x"\t}} {{\nanchor.time\n}}') == (
        "Ana Ana Souza 13:00"
    )


def test_single_braces_around_a_placeholder_are_literal() -> None:
    assert text("{ {{vars.first_name}} }") == "{ Ana }"


# --- time zones ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        ("America/Sao_Paulo", "2030-01-15 10:00"),  # UTC-3
        ("Asia/Kolkata", "2030-01-15 18:30"),  # UTC+5:30
        ("Europe/Berlin", "2030-01-15 14:00"),  # CET, UTC+1
        ("Pacific/Kiritimati", "2030-01-16 03:00"),  # UTC+14: the next day
    ],
)
def test_the_anchor_is_shown_in_the_contacts_zone(zone: str, expected: str) -> None:
    assert text("{{anchor.datetime}}", timezone=zone) == expected


def test_the_anchor_follows_daylight_saving_time() -> None:
    july = datetime(2030, 7, 15, 13, 0, tzinfo=UTC)
    assert text("{{anchor.time}}", timezone="Europe/Berlin", anchor_at=july) == "15:00"  # CEST, UTC+2
    assert text("{{anchor.time}}", timezone="Europe/Berlin") == "14:00"  # CET, UTC+1


def test_the_weekday_and_date_change_across_midnight() -> None:
    late = datetime(2030, 1, 15, 2, 0, tzinfo=UTC)  # Tuesday in UTC, Monday evening in Sao Paulo
    assert text("{{anchor.weekday}} {{anchor.date}}", timezone="America/Sao_Paulo", anchor_at=late) == (
        "Monday 2030-01-14"
    )


def test_an_anchor_given_in_another_offset_is_converted() -> None:
    anchor = datetime(2030, 1, 15, 10, 0, tzinfo=timezone(timedelta(hours=-3)))
    assert text("{{anchor.time}}", timezone="Asia/Kolkata", anchor_at=anchor) == "18:30"


def test_without_a_contact_zone_the_projects_zone_is_used() -> None:
    assert text("{{anchor.time}}", timezone=None, fallback_timezone="Asia/Kolkata") == "18:30"


@pytest.mark.parametrize("bad", ["Not/AZone", "Europe", "", "../etc/passwd"])
def test_an_unknown_contact_zone_falls_back_to_the_projects(bad: str) -> None:
    assert text("{{anchor.time}}", timezone=bad, fallback_timezone="America/Sao_Paulo") == "10:00"


def test_with_no_valid_zone_at_all_utc_is_used() -> None:
    assert text("{{anchor.time}}", timezone="Nowhere/Town", fallback_timezone="Also/Nowhere") == "13:00"


@pytest.mark.parametrize(
    ("anchor", "zone", "expected"),
    [
        (datetime(9999, 12, 31, 23, 30, tzinfo=UTC), "Pacific/Kiritimati", "9999-12-31 23:30"),
        (datetime(1, 1, 1, 0, 30, tzinfo=UTC), "America/Los_Angeles", "0001-01-01 00:30"),
    ],
)
def test_an_anchor_whose_local_time_leaves_the_calendar_is_shown_in_utc(
    anchor: datetime, zone: str, expected: str
) -> None:
    assert text("{{anchor.datetime}}", timezone=zone, anchor_at=anchor) == expected


def test_a_naive_anchor_is_taken_as_utc() -> None:
    assert text("{{anchor.time}}", timezone="Asia/Kolkata", anchor_at=datetime(2030, 1, 15, 13, 0)) == "18:30"


# --- missing values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "changes", "reason"),
    [
        ("Hi {{vars.nickname}}", {}, "missing_variable:vars.nickname"),
        ("Hi {{vars.first_name}}", {"variables": {"first_name": None}}, "missing_variable:vars.first_name"),
        ("Hi {{vars.first_name}}", {"variables": {}}, "missing_variable:vars.first_name"),
        ("{{vars.order}}", {}, "missing_variable:vars.order"),  # an object cannot be rendered
        ("{{vars.items}}", {"variables": {"items": [1, 2]}}, "missing_variable:vars.items"),  # nor a list
        ("{{vars.order.missing}}", {}, "missing_variable:vars.order.missing"),
        ("{{vars.first_name.deeper}}", {}, "missing_variable:vars.first_name.deeper"),  # through a string
        ("{{anchor.date}}", {"anchor_at": None}, "missing_anchor"),
        ("{{anchor.weekday}}", {"anchor_at": None}, "missing_anchor"),
        ("Hi {{contact.name}}", {"contact_name": None}, "missing_variable:contact.name"),
        ("{{contact.phone}}", {"contact_phone": None}, "missing_variable:contact.phone"),
        ("{{contact.attributes.tier}}", {}, "missing_variable:contact.attributes.tier"),
        ("{{contact.attributes.address}}", {}, "missing_variable:contact.attributes.address"),
        (
            "{{contact.attributes.plan}}",
            {"contact_attributes": {"plan": None}},
            "missing_variable:contact.attributes.plan",
        ),
    ],
)
def test_a_missing_value_skips_the_step_with_its_reason(
    source: str, changes: dict[str, Any], reason: str
) -> None:
    assert skipped(source, **changes) == reason


def test_the_first_missing_placeholder_names_the_reason() -> None:
    assert skipped("{{vars.first_name}} {{vars.b}} {{vars.a}}") == "missing_variable:vars.b"
    assert skipped("{{anchor.date}} {{vars.a}}", anchor_at=None) == "missing_anchor"


def test_an_unused_missing_value_does_not_skip() -> None:
    assert text("Hi {{vars.first_name}}", anchor_at=None, contact_name=None) == "Hi Ana"


# --- fallbacks -----------------------------------------------------------------------------------------


def test_a_fallback_fills_a_missing_contact_name() -> None:
    assert text('Hi {{ contact.name | "there" }}!', contact_name=None) == "Hi there!"


def test_a_fallback_is_unused_when_the_value_is_present() -> None:
    assert text('Hi {{ contact.name | "there" }}!') == "Hi Ana Souza!"


@pytest.mark.parametrize(
    ("source", "changes", "expected"),
    [
        ('{{vars.nickname|"friend"}}', {}, "friend"),
        ('{{ vars.order | "your order" }}', {}, "your order"),  # an object counts as missing
        ('{{ anchor.date | "soon" }}', {"anchor_at": None}, "soon"),
        ('{{ contact.phone | "" }}', {"contact_phone": None}, ""),
        ('{{ contact.attributes.tier | "basic" }}', {}, "basic"),
        ('{{ vars.x | "say \\"hi\\"" }}', {}, 'say "hi"'),
        ('{{ vars.x | "back\\\\slash" }}', {}, "back\\slash"),
        ('{{ vars.x | "{{ not a placeholder }} | }}" }}', {}, "{{ not a placeholder }} | }}"),
    ],
)
def test_fallback_literals(source: str, changes: dict[str, Any], expected: str) -> None:
    assert text(source, **changes) == expected


def test_a_fallback_on_one_placeholder_does_not_cover_another() -> None:
    assert skipped('{{ vars.x | "a" }} {{ vars.y }}') == "missing_variable:vars.y"


# --- malformed placeholders ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "placeholder", "words"),
    [
        ("Hi {{vars.first_name", "{{vars.first_name", "unclosed"),
        ("Hi {{ vars.x }} and {{ vars.y", "{{ vars.y", "unclosed"),
        ("{{ vars.x {{ vars.y }}", "{{ vars.x {{ vars.y }}", "bad path segment"),
        ("Hi vars.x}} there", "}}", "stray"),
        ("{{vars.x}} }} ", "}}", "stray"),
        ("{{}}", "{{}}", "empty"),
        ("{{   }}", "{{   }}", "empty"),
        ('{{ | "x" }}', '{{ | "x" }}', "empty"),
        ("{{ first_name }}", "{{ first_name }}", "unknown placeholder"),
        ("{{ variables.x }}", "{{ variables.x }}", "unknown placeholder"),
        ("{{ Vars.x }}", "{{ Vars.x }}", "unknown placeholder"),
        ("{{ vars }}", "{{ vars }}", "incomplete"),
        ("{{ anchor }}", "{{ anchor }}", "anchor fields are"),
        ("{{ anchor.hour }}", "{{ anchor.hour }}", "anchor fields are"),
        ("{{ anchor.date.x }}", "{{ anchor.date.x }}", "anchor fields are"),
        ("{{ contact }}", "{{ contact }}", "contact fields are"),
        ("{{ contact.email }}", "{{ contact.email }}", "contact fields are"),
        ("{{ contact.attributes }}", "{{ contact.attributes }}", "contact fields are"),
        ("{{ contact.name.first }}", "{{ contact.name.first }}", "contact fields are"),
        ("{{ vars.first-name }}", "{{ vars.first-name }}", "bad path segment"),
        ("{{ vars.1st }}", "{{ vars.1st }}", "bad path segment"),
        ("{{ vars..x }}", "{{ vars..x }}", "bad path segment"),
        ("{{ vars.x. }}", "{{ vars.x. }}", "bad path segment"),
        ("{{ vars. x }}", "{{ vars. x }}", "bad path segment"),
        ("{{ vars.nome_é }}", "{{ vars.nome_é }}", "bad path segment"),
        ("{{ contact.attributes.my-key }}", "{{ contact.attributes.my-key }}", "bad path segment"),
        ("{{ vars.x | there }}", "{{ vars.x | there }}", "malformed fallback"),
        ("{{ vars.x | }}", "{{ vars.x | }}", "malformed fallback"),
        ("{{ vars.x | 'there' }}", "{{ vars.x | 'there' }}", "malformed fallback"),
        ('{{ vars.x | "a" "b" }}', '{{ vars.x | "a" "b" }}', "malformed fallback"),
        ('{{ vars.x | "a" | "b" }}', '{{ vars.x | "a" | "b" }}', "malformed fallback"),
        ('{{ vars.x | "a\\nb" }}', '{{ vars.x | "a\\nb" }}', "malformed fallback"),
        ('{{ vars.x | "open }}', '{{ vars.x | "open }}', "malformed fallback"),
        ('{{ vars.x | "a\\" }}', '{{ vars.x | "a\\" }}', "malformed fallback"),
        ('{{ "vars.x" }}', '{{ "vars.x" }}', "unknown placeholder"),
        ("{{{vars.x}}}", "{{{vars.x}}}", "ambiguous"),
        ("{{{vars.x}}", "{{{vars.x}}", "ambiguous"),
        ("{{vars.x}}}", "{{vars.x}}}", "ambiguous"),
        ("{{{", "{{{", "ambiguous"),
        ("}}}", "}}", "stray"),
    ],
)
def test_a_malformed_placeholder_is_rejected_by_name(source: str, placeholder: str, words: str) -> None:
    with pytest.raises(TemplateError) as raised:
        parse_template(source)
    assert raised.value.placeholder == placeholder
    assert words in str(raised.value)
    if placeholder != "}}":
        assert placeholder in str(raised.value)


def test_a_template_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown placeholder"):
        parse_template("{{ foo }}")


def test_the_first_malformed_placeholder_is_reported() -> None:
    with pytest.raises(TemplateError) as raised:
        parse_template("{{ vars.ok }} {{ anchor.hour }} {{ nope }}")
    assert raised.value.placeholder == "{{ anchor.hour }}"


def test_a_long_unclosed_placeholder_is_quoted_in_part() -> None:
    with pytest.raises(TemplateError) as raised:
        parse_template("Hi {{ vars.first_name and then a very long sentence\nthat goes on")
    assert raised.value.placeholder == "{{ vars.first_name and then a very long ..."


def test_rendering_a_malformed_string_raises() -> None:
    with pytest.raises(TemplateError):
        render("Hi {{ vars.x", context())


# --- parsing -------------------------------------------------------------------------------------------


def test_parses_are_cached() -> None:
    source = "cached {{ vars.first_name }} {{ anchor.time }}"
    first = parse_template(source)
    assert parse_template(source) is first
    assert isinstance(first, Template)
    assert first.source == source
    assert first.placeholders() == ["vars.first_name", "anchor.time"]


def test_a_parsed_template_renders_like_its_source() -> None:
    source = 'Hi {{ contact.name | "there" }}, order {{vars.order.id}} on {{anchor.weekday}}'
    assert render(parse_template(source), context()) == render(source, context())
    assert render(source, context()).text == "Hi Ana Souza, order 42 on Tuesday"
