"""The dashboard's enrollment pages over HTTP: filters, the timeline, pause / resume / stop with a
note, enrolling one contact, the contact card, and bulk enrollment from a CSV."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest

from libs.common.followups.definition import MessageStep
from libs.common.rules.bulk import process_chunk
from services.api.dashboard.render import instant
from services.release.release import release_one
from tests.dashboard_helpers import (
    add_step,
    api,
    bulk_upload,
    create_rule_via_form,
    enroll,
    errors_on,
    field_error,
    make_sequence_via_form,
    publish,
)
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows
from tests.rule_helpers import process

# --- enrollments --------------------------------------------------------------------------------------------


def test_enroll_one_contact_and_follow_its_timeline(signed_in, project, runtime, clock) -> None:
    client, token = signed_in
    make_contact(runtime.pool, project.id, phone="+14155550177", name="Ada")
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Hi {{contact.name}}, {{vars.product}}?")
    add_step(client, token, sequence_id, text="Still there?", wait_value="1", wait_unit="days")
    publish(client, token, sequence_id)
    enrollment_id = enroll(
        client, token, sequence_id, "+1 415 555 0177", variables="product=boots", anchor_at="2030-01-01T10:00"
    )
    timeline = client.get(f"/app/enrollments/{enrollment_id}/timeline").text
    assert "Step 1 · message: next" in timeline and "Step 2 · message: later" in timeline
    assert "data-final" not in timeline
    # the release queues step 1: the timeline shows it with its message and the wait for step 2
    release_one(runtime.pool, clock, runtime.settings.followup)
    timeline = client.get(f"/app/enrollments/{enrollment_id}/timeline").text
    assert "Step 1 · message: queued" in timeline and "Hi Ada, boots?" in timeline
    assert 'status-QUEUED">QUEUED' in timeline and "Step 2 · message: next" in timeline
    detail = client.get(f"/app/enrollments/{enrollment_id}").text
    assert f'data-refresh="/app/enrollments/{enrollment_id}/timeline"' in detail
    assert "anchor 2030-01-01 10:00:00 UTC" in detail
    # pause, resume, stop with a note
    assert "Paused." in client.post(f"/app/enrollments/{enrollment_id}/pause", data={"_csrf": token}).text
    conflict = client.post(f"/app/enrollments/{enrollment_id}/pause", data={"_csrf": token})
    assert conflict.status_code == 409 and "the enrollment is paused" in conflict.text
    assert "Resumed." in client.post(f"/app/enrollments/{enrollment_id}/resume", data={"_csrf": token}).text
    too_long = client.post(f"/app/enrollments/{enrollment_id}/stop", data={"_csrf": token, "note": "n" * 501})
    assert too_long.status_code == 422 and "at most 500" in field_error(too_long.text, "note")
    stopped = client.post(
        f"/app/enrollments/{enrollment_id}/stop", data={"_csrf": token, "note": "asked by phone"}
    )
    assert (
        "Stopped." in stopped.text and "note: asked by phone" in stopped.text and "data-final" in stopped.text
    )
    assert rows(runtime.pool, "SELECT status, reason, note FROM followup_enrollments") == [
        ("stopped", "manual", "asked by phone")
    ]


def test_enrollment_errors_are_shown_next_to_their_field(signed_in, project, runtime) -> None:
    client, token = signed_in
    make_contact(runtime.pool, project.id, phone="+14155550178")
    sequence_id = make_sequence_via_form(client, token, "S")
    add_step(client, token, sequence_id, text="Hi")
    draft = client.post(
        "/app/enrollments/new", data={"_csrf": token, "sequence_id": sequence_id, "contact": "+14155550178"}
    )
    assert draft.status_code == 409 and "no published version" in field_error(draft.text, "sequence_id")
    publish(client, token, sequence_id)
    cases = [
        ({"contact": "+14155550999"}, "contact", "no contact has the phone number"),
        ({"contact": "nobody"}, "contact", "E.164"),
        ({"contact": ""}, "contact", "enter the contact"),
        ({"sequence_id": ""}, "sequence_id", "choose a sequence"),
        ({"variables": "no equals sign"}, "variables", "is not key=value"),
        ({"anchor_at": "tomorrow"}, "anchor_at", "date and time"),
    ]
    for fields, name, message in cases:
        data = {"_csrf": token, "sequence_id": sequence_id, "contact": "+14155550178"} | fields
        response = client.post("/app/enrollments/new", data=data)
        assert response.status_code in (404, 409, 422)
        assert message in field_error(response.text, name), (fields, errors_on(response.text))
    enroll(client, token, sequence_id, "+14155550178")
    again = client.post(
        "/app/enrollments/new", data={"_csrf": token, "sequence_id": sequence_id, "contact": "+14155550178"}
    )
    assert again.status_code == 409 and "already has a live enrollment" in field_error(again.text, "contact")


def test_the_enrollment_list_filters_by_sequence_status_and_contact(
    signed_in, project, runtime, clock
) -> None:
    client, token = signed_in
    first = make_sequence(runtime.pool, project.id)
    second = make_sequence(runtime.pool, project.id)
    ada = make_contact(runtime.pool, project.id, phone="+14155550181", name="Ada")
    bob = make_contact(runtime.pool, project.id, phone="+14155550182", name="Bob")
    make_enrollment(runtime.pool, clock, project.id, first, ada)
    make_enrollment(runtime.pool, clock, project.id, second, bob)
    paused = make_enrollment(runtime.pool, clock, project.id, second, ada)
    client.post(f"/app/enrollments/{paused.id}/pause", data={"_csrf": token})

    def listed(query: str) -> set[str]:
        page = client.get(f"/app/enrollments?{query}").text
        return set(re.findall(r'href="/app/enrollments/([0-9a-f-]{36})"', page))

    assert len(listed("")) == 3
    assert len(listed(f"sequence_id={second}")) == 2
    assert listed("status=paused") == {str(paused.id)}
    assert len(listed("contact=%2B14155550181")) == 2
    assert len(listed(f"contact={bob}&sequence_id={second}")) == 1
    missing = client.get("/app/enrollments?contact=%2B14155550999")
    assert "no contact has the phone number" in field_error(missing.text, "contact")
    assert (
        "No enrollments match." in client.get(f"/app/enrollments?status=completed&sequence_id={first}").text
    )


def test_the_enrollment_list_is_newest_first_with_the_step_each_is_at(
    signed_in, project, runtime, clock
) -> None:
    client, token = signed_in
    # Given a three-step sequence: Ada's enrollment (made on the dashboard) completes it, Bob's starts
    sequence_id = make_sequence_via_form(client, token, "Three")
    for text in ("one", "two", "three"):
        add_step(client, token, sequence_id, text=text)
    publish(client, token, sequence_id)
    make_contact(runtime.pool, project.id, phone="+14155550183", name="Ada")
    make_contact(runtime.pool, project.id, phone="+14155550184", name="Bob")
    done = enroll(client, token, sequence_id, "+14155550183")
    for _ in range(3):
        release_one(runtime.pool, clock, runtime.settings.followup)
        clock.advance(timedelta(seconds=6))  # Ada's spacing between two messages
    enroll(client, token, sequence_id, "+14155550184")

    # Then the list shows Bob first at step 1, and Ada at the last step she reached (3, not 4)
    page = client.get("/app/enrollments").text
    row = r'<td><a href="/app/contacts/[^"]+">(\w+)</a></td>.*?<td class="num">([^<]+)</td>'
    listed = re.findall(row, page, re.S)
    assert listed == [("Bob", "1"), ("Ada", "3")]
    # the enrollment is recorded as the dashboard's, and a finished one has nothing due
    found = api(client, project, "GET", f"/v1/enrollments/{done}")["enrollment"]
    assert (found["status"], found["source"], found["next_run_at"]) == ("completed", "dashboard", None)
    assert "Enrolled (Dashboard)" in client.get(f"/app/enrollments/{done}").text


def test_times_are_shown_to_the_second_with_how_far_they_are(signed_in, project, runtime, clock) -> None:
    client, _ = signed_in
    # Given an enrollment whose first step is due in 25 seconds
    sequence_id = make_sequence(runtime.pool, project.id, MessageStep(text="Hi", delay_seconds=25))
    contact = make_contact(runtime.pool, project.id)
    enrollment = make_enrollment(runtime.pool, clock, project.id, sequence_id, contact)
    due = clock.now() + timedelta(seconds=25)
    # Then its page says when, to the second, and in how long
    page = client.get(f"/app/enrollments/{enrollment.id}").text
    shown = f'{due:%Y-%m-%d %H:%M:%S} UTC <span class="relative">(in 25 s)</span>'
    assert f'<dd><time datetime="{instant(due)}">{shown}</time>' in page
    # and three minutes on, the enrollment was made 3 min ago
    clock.advance(timedelta(minutes=3))
    listed = client.get("/app/enrollments").text
    assert (
        f'{enrollment.enrolled_at:%Y-%m-%d %H:%M:%S} UTC <span class="relative">(3 min ago)</span>' in listed
    )
    # the page says when it was drawn, the moment its script counts the relative times on from
    assert f'<body data-now="{instant(clock.now())}">' in listed


# --- contact card -------------------------------------------------------------------------------------------


def test_the_contact_card_shows_live_follow_ups_pending_rules_and_opt_out(
    signed_in, project, runtime, clock
) -> None:
    client, token = signed_in
    create_rule_via_form(
        client,
        token,
        name="later",
        event="contact.created",
        execute="delayed",
        delay_value="3",
        delay_unit="hours",
        **{"actions.0.type": "add_contact_tag", "actions.0.tags": "x"},
    )
    created = client.post(
        "/app/contacts/new",
        data={
            "_csrf": token,
            "phone": "+14155550190",
            "name": "Ada",
            "timezone": "Europe/Lisbon",
            "tags": "vip, lead",
        },
        follow_redirects=False,
    )
    assert created.status_code == 303
    contact_id = created.headers["location"].split("/")[3].split("?")[0]
    process(runtime)
    sequence_id = make_sequence(runtime.pool, project.id)
    enrollment = make_enrollment(runtime.pool, clock, project.id, sequence_id, uuid.UUID(contact_id))
    card = client.get(f"/app/contacts/{contact_id}").text
    assert "Not opted out" in card and "<dt>Consent</dt><dd>unknown " in card
    assert '<span class="tag">lead ' in card and '<span class="tag">vip ' in card
    assert f'href="/app/enrollments/{enrollment.id}"' in card
    assert 'status-pending">pending' in card and "later" in card
    # cancel the pending rule execution from the card: back on the card, none pending, and it is skipped
    pending = api(client, project, "GET", "/v1/rules")["items"][0]["id"]
    [execution] = api(client, project, "GET", f"/v1/rules/{pending}/executions")["items"]
    cancel = f"/app/rules/{pending}/executions/{execution['id']}/cancel"
    assert f'action="{cancel}"' in card
    cancelled = client.post(
        cancel, data={"_csrf": token, "back": f"/app/contacts/{contact_id}"}, follow_redirects=False
    )
    assert cancelled.headers["location"] == f"/app/contacts/{contact_id}?notice=cancelled"
    assert "No rule executions pending for this contact." in client.get(f"/app/contacts/{contact_id}").text
    [after] = api(client, project, "GET", f"/v1/rules/{pending}/executions")["items"]
    assert (after["status"], after["skip_reason"]) == ("skipped", "cancelled")
    # stop from the card: back on the card, nothing live
    stopped = client.post(
        f"/app/enrollments/{enrollment.id}/stop",
        data={"_csrf": token, "note": "from the card", "back": f"/app/contacts/{contact_id}"},
        follow_redirects=False,
    )
    assert stopped.headers["location"] == f"/app/contacts/{contact_id}?notice=stopped"
    assert "No live follow-ups for this contact." in client.get(f"/app/contacts/{contact_id}").text
    api(client, project, "POST", "/v1/events", json={"type": "contact.opted_out", "contact_id": contact_id})
    assert "Opted out</strong> since" in client.get(f"/app/contacts/{contact_id}").text
    # a refused new contact shows its errors next to the fields
    taken = client.post("/app/contacts/new", data={"_csrf": token, "phone": "+14155550190"})
    assert taken.status_code == 409 and field_error(taken.text, "phone")
    bad = client.post("/app/contacts/new", data={"_csrf": token, "phone": "12", "timezone": "Mars/Base"})
    assert bad.status_code == 422 and "E.164" in field_error(bad.text, "phone")


# --- bulk ---------------------------------------------------------------------------------------------------


def test_bulk_enrollment_from_a_csv_with_its_progress(signed_in, project, runtime, clock) -> None:
    client, token = signed_in
    sequence_id = make_sequence(runtime.pool, project.id)
    known = [make_contact(runtime.pool, project.id, phone=f"+1415555040{i}") for i in range(3)]
    csv_text = "name,phone\nA,+14155550400\nB,+14155550401\nC,+14155550499\n,\n"
    job_id = bulk_upload(client, token, str(sequence_id), csv_text)
    page = client.get(f"/app/bulk/{job_id}").text
    assert f'data-refresh="/app/bulk/{job_id}/progress"' in page and '<progress id="bulk-progress"' in page
    # the Cancel button is part of the fragment the page refreshes: a finished job loses it live
    cancel = f'action="/app/bulk/{job_id}/cancel"'
    assert cancel in client.get(f"/app/bulk/{job_id}/progress").text
    process_chunk(runtime.pool, clock)
    progress = client.get(f"/app/bulk/{job_id}/progress").text
    assert "data-final" in progress and "3 of 3 contacts processed" in progress and "2 enrolled" in progress
    assert cancel not in progress and cancel not in client.get(f"/app/bulk/{job_id}").text
    assert "Unknown contact: 1" in progress
    skipped = client.get(f"/app/bulk/{job_id}/skipped.csv")
    assert skipped.headers["content-type"].startswith("text/csv") and "unknown_contact" in skipped.text
    # contact ids in the first column, without a header
    job2 = bulk_upload(client, token, str(sequence_id), f"{known[2]}\n")
    process_chunk(runtime.pool, clock)
    assert "1 enrolled" in client.get(f"/app/bulk/{job2}/progress").text


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [("", "choose a CSV file"), ("phone\n", "no contacts"), (b"\xff\xfe\x00", "not UTF-8")],
)
def test_bulk_upload_errors_are_shown_next_to_the_file(
    signed_in, project, runtime, csv_text, message
) -> None:
    client, token = signed_in
    sequence_id = make_sequence(runtime.pool, project.id)
    files = {"file": ("c.csv", csv_text if isinstance(csv_text, bytes) else csv_text.encode(), "text/csv")}
    if csv_text == "":
        files = {"file": ("", b"", "application/octet-stream")}
    response = client.post(
        "/app/bulk/new", data={"_csrf": token, "sequence_id": str(sequence_id)}, files=files
    )
    assert response.status_code == 422
    assert message in field_error(response.text, "file")
    draft = make_sequence_via_form(client, token, "Draft")
    refused = client.post(
        "/app/bulk/new",
        data={"_csrf": token, "sequence_id": draft},
        files={"file": ("c.csv", b"+14155550400\n", "text/csv")},
    )
    assert refused.status_code == 422 and "published and active" in field_error(refused.text, "sequence_id")


def test_the_contact_card_shows_the_conversation_newest_first_with_status_and_sender(
    signed_in, project, runtime, clock
) -> None:
    client, _ = signed_in
    contact_id = api(client, project, "POST", "/v1/contacts", json={"phone": "+14155550191"})["id"]
    rule_id = api(
        client,
        project,
        "POST",
        "/v1/rules",
        json={
            "name": "greeter",
            "event": "conversation.created",
            "actions": [{"type": "send_message", "text": "welcome from the rule"}],
        },
    )["id"]
    sequence = api(
        client,
        project,
        "POST",
        "/v1/sequences",
        json={"name": "nurture", "definition": {"steps": [{"kind": "message", "text": "step one text"}]}},
    )["id"]
    api(client, project, "POST", f"/v1/sequences/{sequence}/publish")
    enrollment = api(
        client, project, "POST", "/v1/enrollments", json={"sequence_id": sequence, "contact_id": contact_id}
    )
    while release_one(runtime.pool, runtime.clock, runtime.settings.followup):
        pass
    clock.advance(timedelta(seconds=6))  # the contact's spacing before the rule's message
    api(
        client, project, "POST", "/v1/events", json={"type": "conversation.created", "contact_id": contact_id}
    )
    process(runtime)
    clock.advance(timedelta(seconds=5))
    for index in range(30):
        clock.advance(timedelta(seconds=1))
        api(
            client,
            project,
            "POST",
            "/v1/events",
            json={
                "type": "message.inbound",
                "contact_id": contact_id,
                "provider_message_id": f"dash-{index}",
                "body": f"reply number {index}",
            },
        )

    card = client.get(f"/app/contacts/{contact_id}").text
    assert "<h2>Conversation</h2>" in card
    # newest first: the last reply leads, 25 on the first page, then a link to older ones
    assert card.index("reply number 29") < card.index("reply number 28")
    assert "reply number 5" in card and "reply number 4<" not in card
    assert card.count("the contact</td>") == 25 and "status-RECEIVED" in card
    [older] = re.findall(r'href="(/app/contacts/[^"]+\?messages_after=[^"]+)"', card)
    rest = client.get(older.replace("&amp;", "&")).text
    assert "reply number 4<" in rest and "reply number 0<" in rest and "reply number 5<" not in rest
    # what each outbound message's sender and status are
    assert f'href="/app/rules/{rule_id}">greeter</a>' in rest and "welcome from the rule" in rest
    assert f'href="/app/enrollments/{enrollment["id"]}">nurture</a>, version 1, step 1' in rest
    assert "step one text" in rest and 'status-CANCELLED">CANCELLED' in rest
    assert rest.index("welcome from the rule") < rest.index("step one text")
    assert "Older messages" not in rest
