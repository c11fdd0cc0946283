"""Contact events through ``POST /v1/events``: opt-out and opt-in, leads and deals, ids that are the
project's own, and ``contact.erased`` leaving nothing that identifies the person."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, new_phone
from tests.helpers import rows
from tests.platform_event_helpers import (
    one,
    outbox,
    post_event,
    release,
    sequence_with,
    status_of,
    stopped_total,
)

# --- contacts, leads, deals ------------------------------------------------------------------------------


def test_opt_out_and_opt_in(client: TestClient[Any], runtime: Runtime, project: Project) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence_with(pool, project.id), contact).id
    before = stopped_total("opted_out")

    first = post_event(client, {"type": "contact.opted_out", "contact_id": str(contact)}, 200)
    again = post_event(client, {"type": "contact.opted_out", "contact_id": str(contact)}, 200)

    assert first["applied"] is True and first["stopped_enrollment_ids"] == [str(enrollment)]
    assert again["applied"] is False and again["stopped_enrollment_ids"] == []
    assert stopped_total("opted_out") - before == 1
    body = client.get(f"/v1/contacts/{contact}").json()
    assert body["opted_out_at"] is not None and body["consent"] == "revoked"
    # an opted-out contact cannot be enrolled
    response = client.post(
        "/v1/enrollments", json={"contact_id": str(contact), "steps": [{"kind": "message", "text": "x"}]}
    )
    assert response.status_code == 409

    opted_in = post_event(client, {"type": "contact.opted_in", "contact_id": str(contact)}, 200)
    assert opted_in["applied"] is True
    assert (
        post_event(client, {"type": "contact.opted_in", "contact_id": str(contact)}, 200)["applied"] is False
    )
    body = client.get(f"/v1/contacts/{contact}").json()
    assert body["opted_out_at"] is None and body["consent"] == "granted"
    assert status_of(pool, enrollment) == ("stopped", "opted_out")  # opting in does not resume anything


def test_leads_and_deals(client: TestClient[Any], runtime: Runtime, project: Project) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence_with(pool, project.id), contact).id
    lead_id = str(uuid.uuid4())

    created = post_event(
        client, {"type": "lead.created", "contact_id": str(contact), "lead_id": lead_id}, 201
    )
    repeated = post_event(
        client, {"type": "lead.created", "contact_id": str(contact), "lead_id": lead_id}, 200
    )
    assert created["applied"] is True and repeated["applied"] is False
    someone_else = str(make_contact(pool, project.id))
    taken = client.post(
        "/v1/events", json={"type": "lead.created", "contact_id": someone_else, "lead_id": lead_id}
    )
    assert taken.status_code == 409 and taken.json()["errors"][0]["field"] == "lead_id"
    changed = post_event(
        client, {"type": "lead.status_changed", "lead_id": lead_id, "status": "qualified"}, 200
    )
    assert changed["stopped_enrollment_ids"] == [] and changed["contact_id"] == str(contact)
    assert status_of(pool, enrollment) == ("active", None)
    assert one(pool, "SELECT status, closed_at FROM leads WHERE id = %s", lead_id) == ("qualified", None)

    closed = post_event(client, {"type": "lead.closed", "lead_id": lead_id, "status": "lost"}, 200)
    assert closed["stopped_enrollment_ids"] == [str(enrollment)]
    assert status_of(pool, enrollment) == ("stopped", "lead_closed")
    status, closed_at = one(pool, "SELECT status, closed_at FROM leads WHERE id = %s", lead_id)
    assert status == "lost" and closed_at == runtime.clock.now()
    runtime.clock.advance(timedelta(hours=1))  # type: ignore[attr-defined]
    post_event(client, {"type": "lead.closed", "lead_id": lead_id, "status": "lost"}, 200)
    assert one(pool, "SELECT closed_at FROM leads WHERE id = %s", lead_id) == closed_at  # a repeat keeps it

    deal_id = str(uuid.uuid4())
    deal = post_event(
        client,
        {
            "type": "deal.stage_changed",
            "deal_id": deal_id,
            "stage": "proposal",
            "contact_id": str(contact),
            "lead_id": lead_id,
        },
        200,
    )
    assert (deal["contact_id"], deal["status"]) == (str(contact), "proposal")
    post_event(client, {"type": "deal.stage_changed", "deal_id": deal_id, "stage": "won"}, 200)
    assert one(pool, "SELECT stage, contact_id, lead_id FROM deals WHERE id = %s", deal_id) == (
        "won",
        contact,
        uuid.UUID(lead_id),
    )
    missing = client.post(
        "/v1/events", json={"type": "deal.stage_changed", "deal_id": str(uuid.uuid4()), "stage": "x"}
    )
    assert missing.status_code == 404
    unknown_lead = client.post("/v1/events", json={"type": "lead.closed", "lead_id": str(uuid.uuid4())})
    assert unknown_lead.status_code == 404 and unknown_lead.json()["errors"][0]["field"] == "lead_id"


def test_ids_are_the_projects_own_another_projects_are_neither_seen_nor_taken(
    client: TestClient[Any], runtime: Runtime, project: Project, other_project: Project
) -> None:
    # Given another project's contact, lead, deal and conversation
    pool = runtime.pool
    theirs = make_contact(pool, other_project.id)
    lead = post_event(client, {"type": "lead.created", "contact_id": str(theirs)}, None)
    assert lead["status"] == 404
    their_lead = client.post(
        "/v1/events", json={"type": "lead.created", "contact_id": str(theirs)}, headers=other_project.headers
    ).json()["lead_id"]
    deal = str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    for event in (
        {"type": "deal.stage_changed", "deal_id": deal, "stage": "a", "contact_id": str(theirs)},
        {"type": "conversation.created", "conversation_id": conversation, "contact_id": str(theirs)},
    ):
        response = client.post("/v1/events", json=event, headers=other_project.headers)
        assert response.status_code in (200, 201), response.text
    mine = make_contact(pool, project.id)
    # When this project changes them by id without a contact of its own: they are not found
    for event in (
        {"type": "lead.closed", "lead_id": their_lead},
        {"type": "lead.status_changed", "lead_id": their_lead, "status": "x"},
        {"type": "deal.stage_changed", "deal_id": deal, "stage": "b"},
        {"type": "conversation.resolved", "conversation_id": conversation},
    ):
        response = client.post("/v1/events", json=event)
        assert response.status_code == 404, (event, response.text)
    # And when it creates its own under the same ids, they are created: an id tells nothing of another
    # project's, and no project can take one that another will need
    for event in (
        {"type": "lead.created", "contact_id": str(mine), "lead_id": their_lead},
        {"type": "deal.stage_changed", "deal_id": deal, "stage": "b", "contact_id": str(mine)},
        {"type": "conversation.created", "conversation_id": conversation, "contact_id": str(mine)},
    ):
        response = client.post("/v1/events", json=event)
        assert response.status_code in (200, 201), (event, response.text)
    # Then each project holds its own row under the id, and the other project's rows are unchanged
    for table, row_id in (("leads", their_lead), ("deals", deal), ("conversations", conversation)):
        holders = rows(pool, f"SELECT project_id, contact_id FROM {table} WHERE id = %s ORDER BY 1", row_id)
        assert sorted(holders) == sorted([(other_project.id, theirs), (project.id, mine)]), table
    for sql, row_id, expected in (
        ("SELECT stage FROM deals WHERE project_id = %s AND id = %s", deal, "a"),
        ("SELECT status FROM leads WHERE project_id = %s AND id = %s", their_lead, "open"),
        ("SELECT status FROM conversations WHERE project_id = %s AND id = %s", conversation, "open"),
    ):
        assert one(pool, sql, other_project.id, row_id) == expected
    # And a deal of this project may not point at the other project's lead unless it has its own
    response = client.post(
        "/v1/events",
        json={
            "type": "deal.stage_changed",
            "deal_id": str(uuid.uuid4()),
            "stage": "b",
            "contact_id": str(mine),
            "lead_id": str(uuid.uuid4()),
        },
    )
    assert response.status_code == 404, response.text


# --- contact.erased --------------------------------------------------------------------------------------


def test_an_erased_contact_leaves_nothing_that_identifies_the_person(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    pool = runtime.pool
    phone = new_phone()
    contact = make_contact(
        pool,
        project.id,
        phone=phone,
        name="Grace Hopper",
        timezone="Europe/Paris",
        attributes={"email": "grace@example.com"},
        tags=["vip"],
    )
    other = make_contact(pool, project.id, name="Someone else")
    sequence = sequence_with(pool, project.id, reply=False, opt_out=False)
    enrollment = make_enrollment(
        pool,
        runtime.clock,
        project.id,
        sequence,
        contact,
        variables={"first_name": "Grace"},
        dedupe_key=f"grace-{phone}",
    ).id
    kept = make_enrollment(pool, runtime.clock, project.id, sequence, other, variables={"x": 1}).id
    release(runtime)
    conversation = post_event(
        client,
        {
            "type": "message.inbound",
            "contact_id": str(contact),
            "provider_message_id": "g1",
            "body": "my address is ...",
        },
        201,
    )["conversation_id"]
    post_event(client, {"type": "lead.created", "contact_id": str(contact)}, 201)
    # the reply's time is on the contact (the release path reads it there) until the erasure
    assert one(pool, "SELECT last_inbound_at FROM contacts WHERE id = %s", contact) == runtime.clock.now()
    before = stopped_total("contact_erased")

    result = post_event(client, {"type": "contact.erased", "contact_id": str(contact)}, 200)

    assert result["stopped_enrollment_ids"] == [str(enrollment)]
    assert stopped_total("contact_erased") - before == 1
    row = one(
        pool,
        "SELECT phone, name, timezone, attributes, tags, last_inbound_at, erased_at FROM contacts"
        " WHERE id = %s",
        contact,
    )
    assert row[:6] == (None, None, None, {}, [], None) and row[6] is not None
    assert rows(pool, "SELECT id FROM messages WHERE contact_id = %s", contact) == []
    assert rows(pool, "SELECT id FROM activities WHERE contact_id = %s", contact) == []
    assert one(
        pool,
        "SELECT last_incoming_message_id, last_outgoing_message_id, waiting_since FROM conversations"
        " WHERE id = %s",
        conversation,
    ) == (None, None, None)
    assert one(
        pool,
        "SELECT status, reason, variables, dedupe_key FROM followup_enrollments WHERE id = %s",
        enrollment,
    ) == ("stopped", "contact_erased", {}, None)
    # nothing of the person anywhere: no table holds the phone, name, e-mail or message text any more
    with pool.connection() as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                " AND table_type = 'BASE TABLE'"
            ).fetchall()
        ]
        for table in tables:
            dump = conn.execute(
                f"SELECT coalesce(string_agg(t::text, '\n'), '') FROM \"{table}\" t"
            ).fetchone()
            assert dump is not None
            for secret in (phone, "Grace", "grace@example.com", "my address"):
                assert secret not in dump[0], (table, secret)
    # the other contact is untouched
    assert one(pool, "SELECT name FROM contacts WHERE id = %s", other) == "Someone else"
    assert one(pool, "SELECT status, variables FROM followup_enrollments WHERE id = %s", kept) == (
        "active",
        {"x": 1},
    )
    # the API shows nothing of the person either
    response = client.get(f"/v1/contacts/{contact}")
    if response.status_code == 200:
        body = response.json()
        assert (body["phone"], body["name"], body["attributes"], body["tags"]) == (None, None, {}, [])
    else:
        assert response.status_code == 404
    listed = client.get("/v1/contacts").json()["items"]
    assert all(c["phone"] != phone for c in listed)
    # and an erased contact takes no more events
    for event in (
        {"type": "message.inbound", "contact_id": str(contact), "provider_message_id": "g2"},
        {"type": "contact.opted_in", "contact_id": str(contact)},
        {"type": "contact.erased", "contact_id": str(contact)},
        {"type": "conversation.created", "contact_id": str(contact)},
        {"type": "message.human", "conversation_id": conversation, "body": "Dear Grace"},
    ):
        assert client.post("/v1/events", json=event).status_code == 404, event
    assert rows(pool, "SELECT id FROM messages WHERE contact_id = %s", contact) == []
    assert len(outbox(pool, "contact.erased")) == 1
