"""The dashboard speaks the user's words: names instead of ids, labels instead of codes (the catalogue of
``libs/common/contracts/labels.py``), colours that say good or bad, a link to every page, archived
sequences out of the way unless asked for."""

from __future__ import annotations

import html
import re

from libs.common.followups.sequences import change_sequence_status
from tests.dashboard_helpers import api
from tests.factories import make_contact, make_enrollment, make_sequence


def test_the_rules_list_names_the_sequence_and_labels_event_and_attributes(
    signed_in, project, runtime
) -> None:
    client, _ = signed_in
    sequence_id = make_sequence(runtime.pool, project.id)
    [name] = [s["name"] for s in api(client, project, "GET", "/v1/sequences")["items"]]
    body = {
        "name": "VIP onboarding",
        "event": "contact.tag_added",
        "conditions": {"all": [{"attribute": "event.tags_added", "operator": "contains", "value": "vip"}]},
        "actions": [{"type": "enroll_in_sequence", "sequence_id": str(sequence_id)}],
    }
    api(client, project, "POST", "/v1/rules", json=body)
    page = client.get("/app/rules").text
    assert f"enroll in sequence: {name}" in page and str(sequence_id) not in page
    assert "Tag added to the contact" in page and "<code>contact.tag_added</code>" not in page
    assert 'Tags this change added contains "vip"' in html.unescape(page)


def test_every_page_is_in_the_navigation(signed_in) -> None:
    client, _ = signed_in
    page = client.get("/app/bulk").text
    nav = re.search(r'<nav aria-label="Main">(.*?)</nav>', page, re.S)
    assert nav is not None
    links = re.findall(r'href="(/app/[a-z-]+)"', nav.group(1))
    assert links == [
        "/app/sequences",
        "/app/enrollments",
        "/app/bulk",
        "/app/rules",
        "/app/contacts",
        "/app/settings",
        "/app/api-keys",
    ]
    assert '<a href="/app/bulk" aria-current="page">Bulk</a>' in nav.group(1)


def test_archived_sequences_are_listed_only_when_asked_for(signed_in, project, runtime, clock) -> None:
    client, _ = signed_in
    kept, archived = make_sequence(runtime.pool, project.id), make_sequence(runtime.pool, project.id)
    with runtime.pool.connection() as conn:
        change_sequence_status(conn, project.id, archived, "archive", now=clock.now())
    everything = client.get("/app/sequences").text
    assert f"/app/sequences/{kept}" in everything and f"/app/sequences/{archived}" not in everything
    asked = client.get("/app/sequences?status=archived").text
    assert f"/app/sequences/{archived}" in asked and f"/app/sequences/{kept}" not in asked
    # the API lists every sequence, as before
    listed = {s["id"] for s in api(client, project, "GET", "/v1/sequences")["items"]}
    assert listed == {str(kept), str(archived)}


def test_statuses_are_coloured_by_what_they_mean(signed_in, project, runtime, clock) -> None:
    client, token = signed_in
    sequence_id = make_sequence(runtime.pool, project.id)
    ids = {}
    for name in ("replied", "opted_out", "manual"):
        contact = make_contact(runtime.pool, project.id)
        ids[name] = make_enrollment(runtime.pool, clock, project.id, sequence_id, contact)
    api(
        client,
        project,
        "POST",
        "/v1/events",
        json={
            "type": "message.inbound",
            "contact_id": str(ids["replied"].contact_id),
            "provider_message_id": "r",
        },
    )
    api(
        client,
        project,
        "POST",
        "/v1/events",
        json={"type": "contact.opted_out", "contact_id": str(ids["opted_out"].contact_id)},
    )
    client.post(f"/app/enrollments/{ids['manual'].id}/stop", data={"_csrf": token})

    def badge(name: str) -> str:
        page = client.get(f"/app/enrollments/{ids[name].id}").text
        found = re.search(
            r'<h1>Enrollment <span class="status (tone-\w+) status-stopped">([^<]+)</span>', page
        )
        assert found is not None, page
        return f"{found.group(1)} {found.group(2)}"

    assert badge("replied") == "tone-good stopped: Contact replied"
    assert badge("opted_out") == "tone-bad stopped: Contact opted out"
    assert badge("manual") == "tone-neutral stopped: By hand"
