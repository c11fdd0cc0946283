"""The contact card's edits over HTTP: tags, attributes, opt-out and consent, through the same domain
functions as the API (so the same events are written and the same stop paths run), and their errors next
to the field they name."""

from __future__ import annotations

from tests.dashboard_helpers import api, field_error
from tests.factories import make_contact, make_enrollment, make_sequence


def test_tags_and_attributes_are_edited_on_the_card(signed_in, project, runtime) -> None:
    client, token = signed_in
    contact_id = make_contact(runtime.pool, project.id, phone="+14155550191", name="Ada")
    card = f"/app/contacts/{contact_id}"
    # Given tags and attributes set on the card
    added = client.post(
        f"{card}/tags", data={"_csrf": token, "tags": "vip, demo-booked"}, follow_redirects=False
    )
    assert added.status_code == 303 and added.headers["location"] == f"{card}?notice=saved"
    client.post(f"{card}/attributes", data={"_csrf": token, "attributes": "plan=pro\nscore=80\npaid=true"})
    client.post(f"{card}/tags/remove", data={"_csrf": token, "tag": "demo-booked"})
    client.post(f"{card}/attributes", data={"_csrf": token, "attributes": "", "remove": "paid"})
    # Then the API reads them back, typed
    contact = api(client, project, "GET", f"/v1/contacts/{contact_id}")
    assert (contact["tags"], contact["attributes"]) == (["vip"], {"plan": "pro", "score": 80})
    page = client.get(card).text
    assert "<code>plan</code>: pro" in page and ">vip " in page
    # Bad input is shown next to its field, and changes nothing
    bad = client.post(f"{card}/attributes", data={"_csrf": token, "attributes": "no equals sign"})
    assert bad.status_code == 422 and "is not key=value" in field_error(bad.text, "attributes")
    bad_tag = client.post(f"{card}/tags", data={"_csrf": token, "tags": "x" * 300})
    assert bad_tag.status_code == 422 and field_error(bad_tag.text, "tags")
    assert api(client, project, "GET", f"/v1/contacts/{contact_id}")["tags"] == ["vip"]


def test_opt_out_and_consent_are_set_on_the_card_with_their_stop_path(
    signed_in, project, runtime, clock
) -> None:
    client, token = signed_in
    contact_id = make_contact(runtime.pool, project.id, phone="+14155550192")
    sequence_id = make_sequence(runtime.pool, project.id)
    enrollment = make_enrollment(runtime.pool, clock, project.id, sequence_id, contact_id)
    card = f"/app/contacts/{contact_id}"
    # When the contact is opted out on the card, its follow-up stops as the opt-out event stops it
    assert client.post(f"{card}/opt-out", data={"_csrf": token}).status_code == 200
    read = api(client, project, "GET", f"/v1/enrollments/{enrollment.id}")["enrollment"]
    assert (read["status"], read["reason"]) == ("stopped", "opted_out")
    contact = api(client, project, "GET", f"/v1/contacts/{contact_id}")
    assert contact["opted_out_at"] is not None
    assert "Opt back in" in client.get(card).text
    # and opted back in: consent is granted
    client.post(f"{card}/opt-in", data={"_csrf": token})
    contact = api(client, project, "GET", f"/v1/contacts/{contact_id}")
    assert (contact["opted_out_at"], contact["consent"]) == (None, "granted")
