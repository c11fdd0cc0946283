"""Replies fail closed: a reply that cannot be applied, for whatever reason, still stops the contact's
follow-ups, in a transaction of its own, before the error is answered or the event dead-lettered."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.contracts.platform_events import InboundMessage
from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep
from libs.common.ingress import apply as ingress_apply
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import Ingress, rows


class Injected(Exception):
    """A failure injected after the event's stop point (its triggers are recorded after the stop)."""


@pytest.fixture
def failing_after_the_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise Injected("injected after the stop")

    monkeypatch.setattr(ingress_apply, "record_trigger", fail)  # where ingress.apply.record looks it up


def follow_up_due_later(runtime: Runtime, project_id: uuid.UUID, contact: uuid.UUID) -> uuid.UUID:
    """An enrollment whose first message is QUEUED and whose second step falls due in an hour."""
    pool = runtime.pool
    sequence = make_sequence(
        pool, project_id, MessageStep(text="first"), MessageStep(text="second", delay_seconds=3600)
    )
    enrollment = make_enrollment(pool, runtime.clock, project_id, sequence, contact).id
    assert release_batch(pool, runtime.clock, runtime.settings.followup) == 1
    return enrollment


def assert_nothing_more_goes_out(runtime: Runtime, enrollment: uuid.UUID) -> None:
    """The enrollment stopped on the reply, its queued message cancelled, and once its next step falls
    due the release sends nothing."""
    pool = runtime.pool
    assert rows(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment) == [
        ("stopped", "replied")
    ]
    assert rows(pool, "SELECT status FROM messages WHERE followup_enrollment_id = %s", enrollment) == [
        ("CANCELLED",)
    ]
    assert isinstance(runtime.clock, ManualClock)
    runtime.clock.advance(timedelta(hours=2))
    assert release_batch(pool, runtime.clock, runtime.settings.followup) == 0
    assert rows(pool, "SELECT count(*) FROM messages WHERE followup_enrollment_id = %s", enrollment) == [(1,)]


def test_a_reply_that_fails_over_the_api_still_stops_the_follow_ups(
    failing_after_the_stop: None, client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    # Given a contact with a follow-up under way, and a failure injected after the event's stop point
    contact = make_contact(runtime.pool, project.id)
    enrollment = follow_up_due_later(runtime, project.id, contact)
    # When the contact's reply is posted, it fails (the injected error is an internal one: 500)
    event = {
        "type": "message.inbound",
        "contact_id": str(contact),
        "provider_message_id": "r-1",
        "body": "no",
    }
    response = client.post("/v1/events", json=event)
    assert response.status_code == 500
    # Then the reply is not recorded (its transaction rolled back), but the follow-ups are stopped
    assert rows(runtime.pool, "SELECT count(*) FROM messages WHERE direction = 'inbound'") == [(0,)]
    assert_nothing_more_goes_out(runtime, enrollment)


def test_a_reply_by_phone_that_is_refused_still_stops_the_follow_ups(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    # Given a contact with a follow-up under way
    phone = "+15550001234"
    contact = make_contact(runtime.pool, project.id, phone=phone)
    enrollment = follow_up_due_later(runtime, project.id, contact)
    # When its reply names a conversation that does not exist (refused: 404 naming the field)
    event = {
        "type": "message.inbound",
        "phone": phone,
        "conversation_id": str(uuid.uuid4()),
        "provider_message_id": "r-2",
    }
    response = client.post("/v1/events", json=event)
    assert response.status_code == 404
    assert response.json()["errors"][0]["field"] == "conversation_id"
    # Then the follow-ups are stopped all the same
    assert_nothing_more_goes_out(runtime, enrollment)


def test_a_reply_that_fails_over_the_broker_stops_the_follow_ups_before_it_is_dead_lettered(
    failing_after_the_stop: None, ingress: Ingress, runtime: Runtime, project: Project
) -> None:
    # Given a contact with a follow-up under way, and a failure injected after the event's stop point
    contact = make_contact(runtime.pool, project.id)
    enrollment = follow_up_due_later(runtime, project.id, contact)
    # When its reply arrives over RabbitMQ, the event is dead-lettered
    ingress.send_event(project.id, InboundMessage(contact_id=contact, provider_message_id="r-3"))
    ingress.drain()
    assert len(ingress.dead) == 1
    # Then the follow-ups were stopped first
    assert_nothing_more_goes_out(runtime, enrollment)


def test_a_reply_from_an_unknown_contact_that_fails_stops_nothing_and_is_reported(
    failing_after_the_stop: None, client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    # Given another contact's follow-up under way
    other = make_contact(runtime.pool, project.id)
    enrollment = follow_up_due_later(runtime, project.id, other)
    # When a reply from an unknown contact id fails
    event = {"type": "message.inbound", "contact_id": str(uuid.uuid4()), "provider_message_id": "r-4"}
    assert client.post("/v1/events", json=event).status_code == 404
    # Then nothing else was stopped
    assert rows(runtime.pool, "SELECT status FROM followup_enrollments WHERE id = %s", enrollment) == [
        ("active",)
    ]
