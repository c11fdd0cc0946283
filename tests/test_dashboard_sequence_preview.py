"""The dashboard's preview of a sequence over HTTP: a contact picked (or typed), an anchor and variables,
then the timeline: each step's local time, its waits and their reasons, its text or why it is skipped;
nothing kept; a bad input shown next to its field."""

from __future__ import annotations

import html
import re
import uuid
from datetime import UTC, datetime

import pytest

from tests.dashboard_helpers import api, errors_on, field_error
from tests.helpers import rows

NINE_TO_FIVE = {"start": "09:00", "end": "17:00", "days": ["mon", "tue", "wed", "thu", "fri"]}


def timeline(page: str) -> list[tuple[str, str]]:
    """Each step of the page's timeline: its outcome and its text, whitespace collapsed."""
    found = re.findall(r'<li class="[^"]+" data-outcome="([^"]+)">(.*?)</li>', page, re.S)
    out = []
    for outcome, body in found:
        text = " ".join(re.sub(r"<[^>]+>", " ", html.unescape(body)).split())
        out.append((outcome, text.replace("( ", "(").replace(" )", ")")))
    return out


def one_step_sequence(client, project) -> dict[str, str]:
    """A published sequence named ``s`` of one message."""
    body = {"name": "s", "definition": {"steps": [{"kind": "message", "text": "hi"}]}}
    sequence: dict[str, str] = api(client, project, "POST", "/v1/sequences", json=body)
    api(client, project, "POST", f"/v1/sequences/{sequence['id']}/publish")
    return sequence


def test_the_preview_page_draws_the_timeline_in_the_contacts_zone(signed_in, project, runtime) -> None:
    client, token = signed_in
    assert runtime.clock.now() == datetime(2030, 1, 1, 9, 0, tzinfo=UTC)  # a Tuesday, 04:00 in New York
    api(client, project, "PUT", "/v1/settings", json={"send_window": NINE_TO_FIVE})
    phone = "+14155550123"
    api(
        client,
        project,
        "POST",
        "/v1/contacts",
        json={"phone": phone, "name": "Ada", "timezone": "America/New_York"},
    )
    sequence = api(
        client,
        project,
        "POST",
        "/v1/sequences",
        json={
            "name": "welcome",
            "definition": {
                "steps": [
                    {"kind": "message", "text": "Hi {{contact.name}}, your plan is {{vars.plan}}"},
                    {"kind": "message", "text": "Code {{vars.code}}", "delay_seconds": 3600},
                ]
            },
        },
    )
    api(client, project, "POST", f"/v1/sequences/{sequence['id']}/publish")
    builder = client.get(f"/app/sequences/{sequence['id']}").text
    assert f'href="/app/sequences/{sequence["id"]}/preview"' in builder
    form = client.get(f"/app/sequences/{sequence['id']}/preview").text
    assert f'<option value="{phone}">Ada</option>' in form  # the picker offers the project's contacts

    data = {"_csrf": token, "contact": phone, "variables": "plan=gold"}
    answer = client.post(f"/app/sequences/{sequence['id']}/preview", data=data)

    assert answer.status_code == 200, errors_on(answer.text)
    assert "Timeline in America/New_York" in answer.text
    (first, first_text), (second, second_text) = timeline(answer.text)
    # 04:00 in New York: the first step waits for the window to open at 09:00
    assert first == "queued"
    assert first_text.startswith(
        "Step 1 · Message · sent · Tue 2030-01-01 09:00 local (2030-01-01 14:00:00 UTC"
    )
    assert "Waits: Outside the send window: held until 2030-01-01 14:00:00 UTC" in first_text
    assert first_text.endswith("Hi Ada, your plan is gold")
    assert second == "skipped"
    assert second_text.startswith("Step 2 · Message · skipped · Tue 2030-01-01 10:00 local")
    assert second_text.endswith("A placeholder has no value: vars.code")
    assert rows(runtime.pool, "SELECT count(*) FROM followup_enrollments") == [(0,)]
    assert rows(runtime.pool, "SELECT count(*) FROM messages") == [(0,)]


def test_a_contact_that_cannot_be_enrolled_is_said_so(signed_in, project, runtime) -> None:
    client, token = signed_in
    contact = api(client, project, "POST", "/v1/contacts", json={"phone": "+14155550124"})
    sequence = one_step_sequence(client, project)
    api(
        client,
        project,
        "POST",
        "/v1/enrollments",
        json={"sequence_id": sequence["id"], "contact_id": contact["id"]},
    )

    answer = client.post(
        f"/app/sequences/{sequence['id']}/preview", data={"_csrf": token, "contact": contact["id"]}
    )

    assert answer.status_code == 200, errors_on(answer.text)
    assert "The contact would not be enrolled" in answer.text
    assert timeline(answer.text) == []


@pytest.mark.parametrize(
    ("fields", "name", "message"),
    [
        ({"contact": ""}, "contact", "enter the contact's phone number"),
        ({"contact": "+14155559999"}, "contact", "no contact has the phone number"),
        ({"contact": str(uuid.UUID(int=7))}, "contact", "contact not found"),
        ({"anchor_at": "soon"}, "anchor_at", "a date and time"),
        ({"enrolled_at": "2000-01-01T00:00"}, "enrolled_at", "must not be in the past"),
        ({"variables": "no equals sign"}, "variables", "key=value"),
    ],
)
def test_a_bad_preview_input_is_shown_next_to_its_field(
    signed_in, project, runtime, fields, name, message
) -> None:
    client, token = signed_in
    api(client, project, "POST", "/v1/contacts", json={"phone": "+14155550100"})
    sequence = one_step_sequence(client, project)
    data = {"_csrf": token, "contact": "+14155550100", **fields}

    page = client.post(f"/app/sequences/{sequence['id']}/preview", data=data)

    assert page.status_code in (404, 422), page.text
    assert message in field_error(page.text, name)
    assert "Preview of s" in page.text  # the form kept
