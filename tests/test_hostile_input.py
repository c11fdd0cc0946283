"""Hostile input never loses a reply: a message with a NUL character (PostgreSQL text cannot hold one) is
recorded with the character replaced, and stops the contact's follow-ups as any reply does; any other
event with one is refused with 422 naming the field, before anything is written."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows


def test_a_reply_with_a_nul_character_is_recorded_and_stops_the_follow_ups(
    client: TestClient[Any], runtime: Runtime, project: Project, clock: ManualClock
) -> None:
    pool = runtime.pool
    sequence = make_sequence(
        pool, project.id, MessageStep(text="Hello"), MessageStep(text="Again", delay_seconds=60)
    )
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, sequence, contact)
    assert release_batch(pool, clock, runtime.settings.followup) == 1

    reply = {
        "type": "message.inbound",
        "contact_id": str(contact),
        "provider_message_id": "wamid\x00.1",
        "body": "stop\x00please",
    }
    response = client.post("/v1/events", json=reply)
    assert response.status_code == 201, response.text
    assert response.json()["stopped_enrollment_ids"] == [str(enrollment.id)]
    [(body,)] = rows(pool, "SELECT body FROM messages WHERE direction = 'inbound'")
    assert body == "stop\ufffdplease"
    # the same provider id again is the same message (replaced the same way)
    again = client.post("/v1/events", json=reply)
    assert again.status_code == 200 and again.json()["applied"] is False, again.text
    # and no later step goes out
    clock.advance(timedelta(minutes=5))
    assert release_batch(pool, clock, runtime.settings.followup) == 0
    assert rows(pool, "SELECT count(*) FROM messages WHERE direction = 'outbound'") == [(1,)]


def test_an_agents_message_with_a_nul_character_is_recorded(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    contact = make_contact(runtime.pool, project.id)
    conversation = client.post(
        "/v1/events", json={"type": "conversation.created", "contact_id": str(contact)}
    ).json()["conversation_id"]
    response = client.post(
        "/v1/events", json={"type": "message.human", "conversation_id": conversation, "body": "ok\x00"}
    )
    assert response.status_code == 201, response.text
    assert rows(runtime.pool, "SELECT body FROM messages WHERE source = 'human'") == [("ok\ufffd",)]


def test_any_other_event_with_a_nul_character_is_refused_naming_the_field(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    contact = make_contact(runtime.pool, project.id)
    response = client.post(
        "/v1/events", json={"type": "lead.created", "contact_id": str(contact), "status": "new\x00"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "status"
    assert rows(runtime.pool, "SELECT count(*) FROM leads") == [(0,)]


@pytest.mark.parametrize("anchor_at", ["0001-01-01T00:30:00+00:00", "9999-12-31T23:30:00+00:00"])
def test_an_anchor_too_near_the_ends_of_the_calendar_is_refused_naming_it(
    client: TestClient[Any], runtime: Runtime, project: Project, anchor_at: str
) -> None:
    sequence = make_sequence(
        runtime.pool,
        project.id,
        MessageStep(text="Before", anchor_offset_seconds=-3600),
        MessageStep(text="After", anchor_offset_seconds=3600),
    )
    contact = make_contact(runtime.pool, project.id)
    body = {"sequence_id": str(sequence), "contact_id": str(contact), "anchor_at": anchor_at}
    response = client.post("/v1/enrollments", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "anchor_at"
    assert rows(runtime.pool, "SELECT count(*) FROM followup_enrollments") == [(0,)]
    # and a PATCH of a live enrollment's anchor the same
    fine = client.post("/v1/enrollments", json=body | {"anchor_at": "2030-06-01T12:00:00+00:00"}).json()["id"]
    patched = client.patch(f"/v1/enrollments/{fine}", json={"anchor_at": anchor_at})
    assert patched.status_code == 422, patched.text
    assert patched.json()["errors"][0]["field"] == "anchor_at"
