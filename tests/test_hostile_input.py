"""Hostile input never loses a reply: a message with a NUL character (PostgreSQL text cannot hold one) is
recorded with the character replaced, and stops the contact's follow-ups as any reply does; any other
event with one is refused with 422 naming the field, before anything is written.

Bodies are decoded strictly (a number for a time, a string for a number: 400 naming the field), every
text and stored object is bounded (422 naming the field, on the REST and the broker path alike), and a
body over its route's limit is a 413 problem, over a real connection too."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
from litestar.testing import TestClient

from libs.common.contracts import actors
from libs.common.contracts.limits import MAX_ATTRIBUTES, MAX_JSON_BYTES, MAX_MESSAGE_LENGTH
from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep
from services.api.app import create_app
from services.api.body import MAX_BODY_BYTES
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows, wait_until
from tests.test_api_contacts import assert_problem


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


# --- strict decoding: no number for a time, no string for a number (query strings still convert)


def test_a_number_for_a_time_is_refused_naming_the_field(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    sequence = make_sequence(runtime.pool, project.id)
    contact = make_contact(runtime.pool, project.id)
    body = {"sequence_id": str(sequence), "contact_id": str(contact), "anchor_at": 5}
    assert_problem(client.post("/v1/enrollments", json=body), 400, "anchor_at")
    assert rows(runtime.pool, "SELECT count(*) FROM followup_enrollments") == [(0,)]


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        (
            "/v1/sequences",
            {
                "name": "s",
                "definition": {"steps": [{"kind": "message", "text": "Hi", "delay_seconds": "60"}]},
            },
            "definition.steps.0.delay_seconds",
        ),
        ("/v1/send-lane/claim", {"limit": "5"}, "limit"),
        ("/v1/send-lane/claim", {"limit": 5.0}, "limit"),
        ("/v1/send-lane/claim", {"limit": True}, "limit"),
        ("/v1/contacts", {"phone": 14155550123}, "phone"),
        ("/v1/events", {"type": "contact.opted_out", "contact_id": 5}, "contact_id"),
    ],
)
def test_a_value_of_another_type_is_refused_naming_the_field(
    client: TestClient[Any], url: str, body: dict[str, Any], field: str
) -> None:
    assert_problem(client.post(url, json=body), 400, field)


def test_a_string_for_a_number_is_refused_in_a_one_off_follow_up(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    contact = make_contact(runtime.pool, project.id)
    conversation = client.post(
        "/v1/events", json={"type": "conversation.created", "contact_id": str(contact)}
    ).json()["conversation_id"]
    response = client.post(
        f"/v1/conversations/{conversation}/follow-up", json={"text": "Still there?", "delay_seconds": "60"}
    )
    assert_problem(response, 400, "delay_seconds")
    assert rows(runtime.pool, "SELECT count(*) FROM followup_enrollments") == [(0,)]


def test_query_and_path_parameters_still_convert_from_their_strings(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    contact = make_contact(runtime.pool, project.id)
    listed = client.get("/v1/contacts", params={"limit": "1"})
    assert listed.status_code == 200, listed.text
    assert [item["id"] for item in listed.json()["items"]] == [str(contact)]
    assert client.get(f"/v1/contacts/{contact}").status_code == 200
    assert_problem(client.get("/v1/contacts", params={"limit": "0"}), 422, "limit")


def test_the_caller_is_authenticated_before_the_body_is_judged(client: TestClient[Any]) -> None:
    client.headers.pop("Authorization")
    for body in (
        {"phone": "+14155550123", "name": 5},
        {"phone": "+14155550123", "nmae": "x"},
        "[",
        {"name": ""},
    ):
        content = body if isinstance(body, str) else None
        response = client.post("/v1/contacts", json=None if content else body, content=content)
        assert_problem(response, 401)


# --- sizes: every text and object bounded, 422 naming the field; a body over its route's limit is a 413


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "n" * 1_000_000}, "name"),
        ({"attributes": {"notes": "n" * 1_000_000}}, "attributes"),
        ({"attributes": {"notes": "n" * (MAX_JSON_BYTES + 1)}}, "attributes"),
        ({"attributes": {f"k{i}": i for i in range(MAX_ATTRIBUTES + 1)}}, "attributes"),
        (
            {"attributes": {"k" * 65: 1}},
            "attributes.kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
        ),
    ],
)
def test_an_oversized_contact_field_is_refused_naming_it(
    client: TestClient[Any], runtime: Runtime, body: dict[str, Any], field: str
) -> None:
    assert_problem(client.post("/v1/contacts", json={"phone": "+14155550123", **body}), 422, field)
    assert rows(runtime.pool, "SELECT count(*) FROM contacts") == [(0,)]


def test_attributes_up_to_the_limit_are_taken(client: TestClient[Any]) -> None:
    attributes = {"notes": "n" * (MAX_JSON_BYTES - 100)}
    response = client.post("/v1/contacts", json={"phone": "+14155550123", "attributes": attributes})
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({"kind": "message", "text": "x" * (MAX_MESSAGE_LENGTH + 1)}, "definition.steps.0.text"),
        (
            {"kind": "message", "text": "x", "media_url": "https://e.x/" + "a" * 8192},
            "definition.steps.0.media_url",
        ),
        (
            {"kind": "ai", "instructions": "x" * (MAX_MESSAGE_LENGTH + 1), "fallback": {"kind": "skip"}},
            "definition.steps.0.instructions",
        ),
        (
            {"kind": "ai", "instructions": "x", "fallback": {"kind": "template", "text": "x" * 5000}},
            "definition.steps.0.fallback.text",
        ),
        (
            {"kind": "message", "text": "x", "whatsapp_template": {"name": "t", "parameters": ["p" * 1025]}},
            "definition.steps.0.whatsapp_template.parameters.0",
        ),
    ],
)
def test_an_oversized_step_is_refused_naming_it(
    client: TestClient[Any], runtime: Runtime, step: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/sequences", json={"name": "big", "definition": {"steps": [step]}})
    assert_problem(response, 422, field)
    assert rows(runtime.pool, "SELECT count(*) FROM followup_sequences") == [(0,)]


def test_a_message_step_of_whatsapps_longest_text_publishes(client: TestClient[Any]) -> None:
    step = {"kind": "message", "text": "x" * MAX_MESSAGE_LENGTH}
    sequence = client.post("/v1/sequences", json={"name": "long", "definition": {"steps": [step]}})
    assert sequence.status_code == 201, sequence.text
    published = client.post(f"/v1/sequences/{sequence.json()['id']}/publish")
    assert published.status_code == 201, published.text


def test_a_one_off_follow_up_longer_than_a_message_is_refused_naming_its_text(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    contact = make_contact(runtime.pool, project.id)
    conversation = client.post(
        "/v1/events", json={"type": "conversation.created", "contact_id": str(contact)}
    ).json()["conversation_id"]
    response = client.post(f"/v1/conversations/{conversation}/follow-up", json={"text": "x" * 5000})
    assert_problem(response, 422, "text")
    assert rows(runtime.pool, "SELECT count(*) FROM followup_enrollments") == [(0,)]


@pytest.mark.parametrize(
    ("event", "field"),
    [
        (
            {"type": "message.inbound", "contact_id": "{contact}", "provider_message_id": "p" * 3000},
            "provider_message_id",
        ),
        (
            {
                "type": "message.inbound",
                "contact_id": "{contact}",
                "provider_message_id": "p",
                "body": "b" * 70_000,
            },
            "body",
        ),
        ({"type": "lead.created", "contact_id": "{contact}", "status": "s" * 10_000}, "status"),
        (
            {"type": "message.status", "status": "SENT", "provider_message_id": "p" * 300},
            "provider_message_id",
        ),
    ],
)
def test_an_oversized_event_field_is_refused_naming_it_before_anything_is_written(
    client: TestClient[Any], runtime: Runtime, project: Project, event: dict[str, Any], field: str
) -> None:
    contact = str(make_contact(runtime.pool, project.id))
    response = client.post("/v1/events", json={k: v.format(contact=contact) for k, v in event.items()})
    assert_problem(response, 422, field)
    assert rows(runtime.pool, "SELECT count(*) FROM messages") == [(0,)]
    assert rows(runtime.pool, "SELECT count(*) FROM leads") == [(0,)]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"attributes": {"a": "x" * 1_000_000}}, "attributes"),
        ({"labels": ["l" * 65]}, "labels.0"),
        ({"assignee": "a" * 201}, "assignee"),
        ({"private_note": "n" * 10_001}, "private_note"),
    ],
)
def test_an_oversized_conversation_change_is_refused_naming_it(
    client: TestClient[Any], runtime: Runtime, project: Project, change: dict[str, Any], field: str
) -> None:
    contact = make_contact(runtime.pool, project.id)
    conversation = client.post(
        "/v1/events", json={"type": "conversation.created", "contact_id": str(contact)}
    ).json()["conversation_id"]
    response = client.post(
        "/v1/events", json={"type": "conversation.updated", "conversation_id": conversation, **change}
    )
    assert_problem(response, 422, field)


def test_the_broker_path_refuses_what_the_api_refuses() -> None:
    """The ``platform_event`` actor decodes the same structs: an oversized field never reaches the domain
    (the message is dead-lettered, see services.api.ingress)."""
    payload = {
        "project_id": str(uuid.uuid4()),
        "event": {
            "type": "message.inbound",
            "provider_message_id": "p" * 3000,
            "contact_id": str(uuid.uuid4()),
        },
    }
    with pytest.raises(msgspec.ValidationError, match="length <= 256"):
        actors.PLATFORM_EVENT.decode(payload)


def test_a_body_over_the_limit_is_a_413_problem_naming_the_body(client: TestClient[Any]) -> None:
    big = {"phone": "+14155550123", "name": "n" * MAX_BODY_BYTES}
    assert_problem(client.post("/v1/contacts", json=big), 413, "body")


def test_a_bulk_enrollment_may_be_larger_than_other_bodies(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    sequence = make_sequence(runtime.pool, project.id)
    ids = [str(uuid.uuid4()) for _ in range(100_000)]  # ~3.9 MB: over the default limit, under the bulk one
    response = client.post("/v1/bulk-enrollments", json={"sequence_id": str(sequence), "contact_ids": ids})
    assert response.status_code == 202, response.text


@pytest.fixture
def served(runtime: Runtime) -> Iterator[str]:
    """The API over ``runtime`` behind a real socket (uvicorn in a thread); its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(runtime), log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn started")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.mark.parametrize("size", [11_000_000, 30_000_000])
def test_a_body_over_the_limit_is_answered_413_over_a_real_connection_not_reset(
    served: str, project: Project, size: int
) -> None:
    body = b'{"phone": "+14155550123", "name": "' + b"n" * size + b'"}'
    headers = project.headers | {"content-type": "application/json"}
    response = httpx.post(f"{served}/v1/contacts", content=body, headers=headers, timeout=30)
    assert_problem(response, 413, "body")
    # and a body sent in chunks, without a Content-Length, the same
    chunks = (body[i : i + 65_536] for i in range(0, len(body), 65_536))
    response = httpx.post(f"{served}/v1/contacts", content=chunks, headers=headers, timeout=30)
    assert_problem(response, 413, "body")
