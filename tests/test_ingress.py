"""The ingress actors on the StubBroker: platform events and send-lane claims over the broker call the same
domain functions as the REST API; malformed or rejected messages are dead-lettered, never half-applied."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from libs.common.contracts import actors
from libs.common.contracts.platform_events import ContactOptedOut, InboundMessage, MessageStatus
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep, WhatsAppTemplate
from libs.common.platform.messages import OutboundMessage, queue_contact_message
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence, new_phone
from tests.helpers import Ingress, rows


def stopped_total(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "whatstig_followup_finished_total", {"status": "stopped", "reason": reason}
    )
    return value or 0.0


def queued_follow_up(
    runtime: Runtime, project_id: uuid.UUID, contact: uuid.UUID
) -> tuple[uuid.UUID, uuid.UUID]:
    """An active enrollment whose first message is QUEUED: (enrollment, message)."""
    pool = runtime.pool
    sequence = make_sequence(
        pool, project_id, MessageStep(text="first"), MessageStep(text="second", delay_seconds=86400)
    )
    enrollment = make_enrollment(pool, runtime.clock, project_id, sequence, contact).id
    assert release_batch(pool, runtime.clock, runtime.settings.followup) == 1
    [(message,)] = rows(pool, "SELECT id FROM messages WHERE followup_enrollment_id = %s", enrollment)
    return enrollment, message


def test_an_event_over_the_broker_stops_follow_ups_like_rest(
    ingress: Ingress, runtime: Runtime, project: Project
) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment, message = queued_follow_up(runtime, project.id, contact)
    before = stopped_total("replied")

    ingress.send_event(project.id, InboundMessage(contact_id=contact, provider_message_id="mq-1", body="ok"))
    ingress.send_event(project.id, InboundMessage(contact_id=contact, provider_message_id="mq-1", body="ok"))
    ingress.drain()

    assert ingress.dead == []
    assert rows(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment) == [
        ("stopped", "replied")
    ]
    assert rows(pool, "SELECT status FROM messages WHERE id = %s", message) == [("CANCELLED",)]
    failed = rows(pool, "SELECT data FROM outbox WHERE type = 'message.failed'")
    assert [(f[0]["message_id"], f[0]["reason"]) for f in failed] == [(str(message), "CANCELLED")]
    assert rows(pool, "SELECT count(*) FROM messages WHERE provider_message_id = 'mq-1'") == [(1,)]
    assert stopped_total("replied") - before == 1  # the repeat stopped nothing


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (
            {
                "project_id": "not-a-uuid",
                "event": {"type": "contact.opted_out", "contact_id": str(uuid.uuid4())},
            },
            "project_id",
        ),
        (
            {"project_id": "{project}", "event": {"type": "message.sms", "contact_id": str(uuid.uuid4())}},
            "type",
        ),
        ({"project_id": "{project}", "event": {"type": "contact.opted_out"}}, "contact_id"),
        (
            {"project_id": "{project}", "event": {"type": "message.inbound", "contact_id": "{contact}"}},
            "provider_message_id",
        ),
        ({"project_id": "{project}"}, "event"),
        (
            {
                "project_id": "{project}",
                "event": {"type": "contact.opted_out", "contact_id": "{contact}"},
                "x": 1,
            },
            "x",
        ),
        ("just a string", "object"),
        (None, "object"),
    ],
)
def test_a_malformed_event_is_dead_lettered_with_its_reason_and_the_worker_goes_on(
    ingress: Ingress,
    runtime: Runtime,
    project: Project,
    caplog: pytest.LogCaptureFixture,
    payload: Any,
    named: str,
) -> None:
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment, message = queued_follow_up(runtime, project.id, contact)
    if isinstance(payload, dict):
        payload = {k: (v.format(project=project.id) if isinstance(v, str) else v) for k, v in payload.items()}
        if isinstance(payload.get("event"), dict):
            payload["event"] = {
                k: v.format(contact=contact) if isinstance(v, str) else v for k, v in payload["event"].items()
            }
    outbox_before = rows(pool, "SELECT count(*) FROM outbox")

    with caplog.at_level(logging.ERROR, logger="services.api.ingress"):
        ingress.send_raw(actors.PLATFORM_EVENT.actor, payload)
        ingress.drain()

    # the message is dead-lettered at once (no retries), with its reason logged ...
    assert len(ingress.dead) == 1
    assert ingress.dead[0].message_id is not None
    logged = [r for r in caplog.records if r.name == "services.api.ingress"]
    assert [r.getMessage() for r in logged] == ["malformed ingress message"]
    assert named in logged[0].reason  # type: ignore[attr-defined]
    # ... nothing was applied ...
    assert rows(pool, "SELECT count(*) FROM outbox") == outbox_before
    assert rows(pool, "SELECT status FROM followup_enrollments WHERE id = %s", enrollment) == [("active",)]
    assert rows(pool, "SELECT opted_out_at FROM contacts WHERE id = %s", contact) == [(None,)]

    # ... and the worker keeps processing the messages that follow
    ingress.send_event(project.id, ContactOptedOut(contact_id=contact))
    ingress.drain()
    assert len(ingress.dead) == 1
    assert rows(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment) == [
        ("stopped", "opted_out")
    ]
    assert rows(pool, "SELECT status FROM messages WHERE id = %s", message) == [("CANCELLED",)]


def test_a_message_with_the_wrong_arguments_is_dead_lettered(ingress: Ingress, project: Project) -> None:
    ingress.send_raw(actors.PLATFORM_EVENT.actor)
    ingress.send_raw(actors.PLATFORM_EVENT.actor, {"project_id": str(project.id)}, {"extra": True})
    ingress.drain()
    assert len(ingress.dead) == 2


def test_a_rejected_event_is_dead_lettered_and_nothing_is_half_applied(
    ingress: Ingress,
    runtime: Runtime,
    project: Project,
    other_project: Project,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = runtime.pool
    theirs = make_contact(pool, other_project.id)
    mine = make_contact(pool, project.id)
    enrollment, message = queued_follow_up(runtime, project.id, mine)
    phone = new_phone()
    outbox_before = rows(pool, "SELECT count(*) FROM outbox")

    with caplog.at_level(logging.ERROR, logger="services.api.ingress"):
        # an unknown contact, another project's contact
        ingress.send_event(project.id, InboundMessage(contact_id=uuid.uuid4(), provider_message_id="a"))
        ingress.send_event(project.id, ContactOptedOut(contact_id=theirs))
        # a message of a known contact for an unknown conversation: the message is not kept, but the reply
        # still stops the contact's follow-ups (replies fail closed)
        ingress.send_event(
            project.id, InboundMessage(contact_id=mine, conversation_id=uuid.uuid4(), provider_message_id="b")
        )
        # a new phone with an unknown conversation: the contact it created is rolled back too
        ingress.send_event(
            project.id, InboundMessage(phone=phone, conversation_id=uuid.uuid4(), provider_message_id="c")
        )
        # an unknown project
        ingress.send_event(uuid.uuid4(), InboundMessage(phone=new_phone(), provider_message_id="d"))
        ingress.drain()

    assert len(ingress.dead) == 5
    logged = [r for r in caplog.records if r.getMessage() == "ingress event rejected"]
    assert [r.field for r in logged[:4]] == ["contact_id", "contact_id", "conversation_id", "conversation_id"]  # type: ignore[attr-defined]
    assert all(r.reason for r in logged)  # type: ignore[attr-defined]
    assert len(logged) == 5
    assert rows(pool, "SELECT id FROM messages WHERE direction = 'inbound'") == []
    assert rows(pool, "SELECT id FROM contacts WHERE phone = %s", phone) == []
    assert rows(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment) == [
        ("stopped", "replied")
    ]
    assert rows(pool, "SELECT status FROM messages WHERE id = %s", message) == [("CANCELLED",)]
    # the outbox holds only what the stop wrote
    assert rows(pool, "SELECT type FROM outbox ORDER BY id OFFSET %s", outbox_before[0][0]) == [
        ("followup.stopped",),
        ("message.failed",),
    ]
    assert rows(pool, "SELECT opted_out_at FROM contacts WHERE id = %s", theirs) == [(None,)]


def test_the_claim_actor_claims_queued_messages_with_claimed_events(
    ingress: Ingress, runtime: Runtime, project: Project, other_project: Project
) -> None:
    pool = runtime.pool
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    mine: list[uuid.UUID] = []
    with pool.connection() as conn:
        for project_id, into in ((project.id, mine), (other_project.id, None)):
            contact = make_contact(pool, project_id)
            for i in range(3):
                queued = queue_contact_message(
                    conn,
                    OutboundMessage(project_id=project_id, contact_id=contact, body=f"m{i}", source="api"),
                    now=t0,
                )
                if into is not None:
                    into.append(queued.message_id)

    actors.send(runtime.broker, actors.CLAIM_MESSAGES, actors.ClaimMessages(project_id=project.id, limit=2))
    ingress.drain()
    processing = {r[0] for r in rows(pool, "SELECT id FROM messages WHERE status = 'PROCESSING'")}
    assert len(processing) == 2 and processing <= set(mine)
    actors.send(runtime.broker, actors.CLAIM_MESSAGES, actors.ClaimMessages(project_id=project.id))
    ingress.drain()
    processing = {r[0] for r in rows(pool, "SELECT id FROM messages WHERE status = 'PROCESSING'")}
    assert processing == set(mine)  # the other project's messages stay QUEUED
    claimed = [
        r[0] for r in rows(pool, "SELECT aggregate_id FROM outbox WHERE type = 'message.claimed' ORDER BY id")
    ]
    assert sorted(claimed) == sorted(mine)  # each claimed exactly once
    assert ingress.dead == []

    # a malformed claim is dead-lettered
    ingress.send_raw(actors.CLAIM_MESSAGES.actor, {"limit": 0})
    ingress.drain()
    assert len(ingress.dead) == 1


def test_an_event_that_meets_an_unreachable_database_is_retried_not_dead_lettered(
    ingress: Ingress, runtime: Runtime, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    from libs.common import ingress as domain_ingress
    from libs.common.core.errors import DatabaseUnavailable
    from services.api import ingress as ingress_module

    pool = runtime.pool
    contact = make_contact(pool, project.id)
    enrollment, message = queued_follow_up(runtime, project.id, contact)
    real = domain_ingress.handle_event
    calls: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise DatabaseUnavailable()
        return real(*args, **kwargs)

    monkeypatch.setattr(ingress_module, "handle_event", flaky)
    ingress.send_event(project.id, InboundMessage(contact_id=contact, provider_message_id="late"))
    ingress.drain()

    assert len(calls) == 2 and ingress.dead == []
    assert rows(pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment) == [
        ("stopped", "replied")
    ]
    assert rows(pool, "SELECT status FROM messages WHERE id = %s", message) == [("CANCELLED",)]


def test_an_event_that_finds_the_conversation_held_is_retried_and_applied_once_it_is_free(
    ingress: Ingress, runtime: Runtime, project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a follow-up sent free-form whose step has an approved template, and another transaction holding
    # the contact's open conversation
    pool = runtime.pool
    contact = make_contact(pool, project.id)
    template = WhatsAppTemplate(name="order_reminder", language="en")
    sequence = make_sequence(pool, project.id, MessageStep(text="first", whatsapp_template=template))
    enrollment = make_enrollment(pool, runtime.clock, project.id, sequence, contact).id
    assert release_batch(pool, runtime.clock, runtime.settings.followup) == 1
    [(message, conversation)] = rows(
        pool, "SELECT id, conversation_id FROM messages WHERE followup_enrollment_id = %s", enrollment
    )
    rows(pool, "UPDATE messages SET status = 'SENT' WHERE id = %s RETURNING id", message)
    drained = threading.Thread(target=ingress.drain)
    with pool.connection() as holder, caplog.at_level(logging.INFO, logger="services.api.ingress"):
        holder.execute("SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation,))

        # When the provider's report that it fell outside the window comes over the broker meanwhile
        ingress.send_event(
            project.id, MessageStatus(message_id=message, status="FAILED", error_code="131047")
        )
        drained.start()
        for _ in range(200):
            if any(r.getMessage() == "ingress event deferred: busy" for r in caplog.records):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the event never met the held conversation")
    drained.join()

    # Then it was tried again once the conversation was free, not dead-lettered: the step went again as its
    # template
    assert ingress.dead == []
    assert rows(
        pool,
        "SELECT template_name FROM messages WHERE followup_enrollment_id = %s ORDER BY created_at",
        enrollment,
    ) == [(None,), ("order_reminder",)]
