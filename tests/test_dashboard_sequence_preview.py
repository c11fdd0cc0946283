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


def test_the_timeline_follows_the_contacts_path_through_a_branch_a_wait_and_a_split(
    signed_in, project, runtime
) -> None:
    client, token = signed_in
    phone = "+14155550125"
    api(client, project, "POST", "/v1/contacts", json={"phone": phone, "name": "Ada"})
    steps = [
        {
            "kind": "branch",
            "paths": [
                {
                    "name": "ada",
                    "when": {"all": [{"attribute": "contact.name", "operator": "equal_to", "value": "Ada"}]},
                    "to": "ask",
                }
            ],
        },
        {"kind": "message", "text": "Not Ada", "next": "end"},
        {"kind": "wait_for_reply", "id": "ask", "timeout_seconds": 3600, "on_reply": "exp"},
        {"kind": "message", "text": "Nudge", "next": "end"},
        {
            "kind": "split",
            "id": "exp",
            "experiment": "tone",
            "variants": [{"name": "only", "to": "last"}, {"name": "other", "to": "end"}],
            "winner": "only",
        },
        {"kind": "message", "id": "last", "text": "Thanks, Ada"},
    ]
    sequence = api(
        client, project, "POST", "/v1/sequences", json={"name": "p", "definition": {"steps": steps}}
    )
    api(client, project, "POST", f"/v1/sequences/{sequence['id']}/publish")

    silent = timeline(
        client.post(f"/app/sequences/{sequence['id']}/preview", data={"_csrf": token, "contact": phone}).text
    )
    replying = client.post(
        f"/app/sequences/{sequence['id']}/preview",
        data={"_csrf": token, "contact": phone, "assume_reply": "on"},
    )

    assert [outcome for outcome, _ in silent] == [
        "branched",
        "branched",
        "queued",
        "not_reached",
        "not_reached",
        "not_reached",
    ]
    assert silent[0][1].startswith("Step 1 · Branch · takes a path")
    assert silent[0][1].endswith("Took the path: ada")
    assert silent[1][1].startswith("Step 3 · Wait for a reply · takes a path")
    assert silent[1][1].endswith("No reply by the deadline")
    assert silent[2][1].startswith("Step 4 · Message · sent") and silent[2][1].endswith("Nudge")
    assert 'name="assume_reply" checked' in replying.text
    followed = timeline(replying.text)
    assert [text.split(" · ")[0] for _, text in followed] == [
        "Step 1",
        "Step 3",
        "Step 5",
        "Step 6",
        "Step 2",
        "Step 4",
    ]
    assert followed[2][1].endswith("Assigned the variant: only") and followed[3][1].endswith("Thanks, Ada")
