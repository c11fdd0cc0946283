"""A sequence's statistics (``GET /v1/sequences/{id}/statistics``, and the dashboard's results page that shows
the same numbers): enrollments by status and stop reason; per step its messages by their latest status as
the send lane reported it (each message once), skips by reason, replies to sent messages, and enrollments
stopped before the step. The definitions are those of docs/api.md, "Statistics"."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from tests.conftest import Project, sign_in
from tests.rule_helpers import post_event
from tests.test_api_sequences import enroll, message_step, new_contact, published, release, reply

MESSAGE_FIELDS = ("queued", "processing", "sent", "delivered", "read", "failed", "cancelled", "deleted")


def counts(**given: int) -> dict[str, int]:
    """Message counts: the given fields, zeros for the rest, and their total."""
    found = dict.fromkeys(MESSAGE_FIELDS, 0) | given
    return {"total": sum(found.values()), **found}


def statistics(client: TestClient[Any], sequence_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/sequences/{sequence_id}/statistics")
    assert response.status_code == 200, response.text
    stats: dict[str, Any] = response.json()
    return stats


def message_of(client: TestClient[Any], enrollment: dict[str, Any], step_index: int = 0) -> str:
    [message] = [
        m
        for m in client.get("/v1/messages", params={"enrollment_id": enrollment["id"]}).json()["items"]
        if m["origin"]["step_index"] == step_index
    ]
    message_id: str = message["id"]
    return message_id


def report(client: TestClient[Any], message_id: str, *statuses: str) -> None:
    for status in statuses:
        post_event(client, {"type": "message.status", "message_id": message_id, "status": status})


def inbound(client: TestClient[Any], contact_id: str) -> dict[str, Any]:
    event = {"type": "message.inbound", "contact_id": contact_id, "provider_message_id": str(uuid.uuid4())}
    return post_event(client, event)


def test_statistics_before_any_enrollment_list_every_step_with_zeros(client: TestClient[Any]) -> None:
    sequence_id = published(client, message_step("one"), message_step("two", delay_seconds=60))
    stats = statistics(client, sequence_id)
    assert stats["sequence_id"] == sequence_id
    assert {k: stats[k] for k in ("enrolled", "active", "paused", "completed", "stopped", "failed")} == (
        dict.fromkeys(("enrolled", "active", "paused", "completed", "stopped", "failed"), 0)
    )
    assert (stats["stopped_by_reason"], stats["messages"], stats["replied"]) == ({}, counts(), 0)
    empty_step = {
        "messages": counts(),
        "skipped": 0,
        "skipped_by_reason": {},
        "replied": 0,
        "stopped": 0,
        "stopped_by_reason": {},
    }
    assert stats["steps"] == [{"step_index": i, **empty_step} for i in (0, 1)]


def test_a_sequence_driven_through_every_status_is_counted_once_per_message(
    client: TestClient[Any], clock: ManualClock, runtime: Runtime, project: Project
) -> None:
    # Given a two-step sequence that does not stop on a reply; step 2 only goes to who did not reply
    sequence_id = published(
        client,
        message_step("one"),
        message_step("two", delay_seconds=3600, only_if=["no_reply_since_previous_step"]),
        stop_on={"reply": False},
    )
    names = ("cancelled", "processing", "sent", "delivered", "read", "failed", "opted_out", "paused")
    contacts = {name: new_contact(client) for name in names}
    enrolled = {name: enroll(client, sequence_id, contact) for name, contact in contacts.items()}
    assert client.post(f"/v1/enrollments/{enrolled['paused']['id']}/pause").status_code == 200

    # When step 1 is queued for seven of them; one is stopped by hand (its message still QUEUED: cancelled)
    release(runtime)
    stop = client.post(f"/v1/enrollments/{enrolled['cancelled']['id']}/stop", json={"note": "by phone"})
    assert stop.status_code == 200, stop.text
    # the send lane claims the six others and reports on five
    claimed = client.post("/v1/send-lane/claim", json={"limit": 50}).json()["items"]
    assert len(claimed) == 6
    message = {name: message_of(client, enrolled[name]) for name in names if name != "paused"}
    report(client, message["sent"], "SENT")
    report(client, message["delivered"], "SENT", "DELIVERED")
    report(client, message["read"], "SENT", "DELIVERED", "READ")
    report(client, message["failed"], "FAILED")
    report(client, message["opted_out"], "SENT")
    # the read one is answered; the one still with the send lane too (before it was sent: no reply to it)
    clock.advance(timedelta(seconds=1))
    inbound(client, contacts["read"])
    inbound(client, contacts["processing"])
    post_event(client, {"type": "contact.opted_out", "contact_id": contacts["opted_out"]})
    # a late enrollment's first message stays QUEUED
    late_contact = new_contact(client)
    late = enroll(client, sequence_id, late_contact)
    release(runtime)
    # step 2 falls due for the first ones (not the late one): queued for three, skipped for the two repliers
    clock.advance(timedelta(seconds=3599))
    release(runtime)

    # Then each message counts once, in its latest status
    stats = statistics(client, sequence_id)
    assert (stats["enrolled"], stats["active"], stats["paused"]) == (9, 1, 1)
    assert (stats["completed"], stats["stopped"], stats["failed"]) == (5, 2, 0)
    assert stats["stopped_by_reason"] == {"manual": 1, "opted_out": 1}
    first, second = stats["steps"]
    assert first == {
        "step_index": 0,
        "messages": counts(queued=1, processing=1, sent=2, delivered=1, read=1, failed=1, cancelled=1),
        "skipped": 0,
        "skipped_by_reason": {},
        "replied": 1,
        "stopped": 0,
        "stopped_by_reason": {},
    }
    assert second == {
        "step_index": 1,
        "messages": counts(queued=3),
        "skipped": 2,
        "skipped_by_reason": {"only_if:no_reply_since_previous_step": 2},
        "replied": 0,
        "stopped": 2,
        "stopped_by_reason": {"manual": 1, "opted_out": 1},
    }
    assert stats["messages"] == counts(
        queued=4, processing=1, sent=2, delivered=1, read=1, failed=1, cancelled=1
    )
    assert (stats["skipped"], stats["skipped_by_reason"], stats["replied"]) == (
        2,
        {"only_if:no_reply_since_previous_step": 2},
        1,
    )
    assert late["status"] == "active" and stats["active"] == 1

    # And the results page shows the same numbers
    sign_in(client, project)
    html = client.get(f"/app/sequences/{sequence_id}/results").text
    for step, expected in ((0, first), (1, second)):
        row = re.search(rf'<tr data-step="{step}">(.*?)</tr>', html, re.S)
        assert row is not None, html
        shown = dict(re.findall(r'data-count="(\w+)">(\d+)', row.group(1)))
        wanted = {name: str(expected["messages"][name]) for name in ("total", *MESSAGE_FIELDS[:-1])}
        wanted |= {name: str(expected[name]) for name in ("replied", "skipped", "stopped")}
        assert shown == wanted
    assert "Contact opted out: 1" in html and "By hand: 1" in html
    assert "Condition not met: no reply since the previous step: 2" in html


def test_a_reply_counts_once_for_the_sent_message_it_answers(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    # Given a three-step sequence that does not stop on a reply, each message reported SENT
    sequence_id = published(
        client,
        message_step("one"),
        message_step("two", delay_seconds=3600),
        message_step("three", delay_seconds=3600),
        stop_on={"reply": False},
    )
    a, b = new_contact(client), new_contact(client)
    enrollments = {contact: enroll(client, sequence_id, contact) for contact in (a, b)}

    def send_step(step_index: int) -> None:
        release(runtime)
        client.post("/v1/send-lane/claim", json={"limit": 50})
        for enrollment in enrollments.values():
            report(client, message_of(client, enrollment, step_index), "SENT")

    # When a replies twice to step 1, b once to step 2, and a after the last step
    send_step(0)
    reply(pool, a, clock.now() + timedelta(minutes=1))
    reply(pool, a, clock.now() + timedelta(minutes=2))
    clock.advance(timedelta(hours=1))
    send_step(1)
    reply(pool, b, clock.now() + timedelta(minutes=5))
    clock.advance(timedelta(hours=1))
    send_step(2)
    reply(pool, a, clock.now() + timedelta(minutes=1))

    # Then each step counts the enrollments that answered it
    stats = statistics(client, sequence_id)
    assert [s["replied"] for s in stats["steps"]] == [1, 1, 1]
    assert [s["messages"] for s in stats["steps"]] == [counts(sent=2)] * 3
    assert (stats["replied"], stats["completed"]) == (3, 2)


def test_a_reply_after_a_re_entry_counts_once_for_the_message_it_answers(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    # Given a contact who completed a one-step sequence and was enrolled again, both messages sent
    sequence_id = published(client, message_step("hello"))
    contact = new_contact(client)
    for _ in range(2):
        enrollment = enroll(client, sequence_id, contact)
        release(runtime)
        client.post("/v1/send-lane/claim", json={"limit": 50})
        report(client, message_of(client, enrollment), "SENT")
        clock.advance(timedelta(days=1))

    # When the contact replies after the second message
    reply(pool, contact, clock.now() + timedelta(minutes=1))

    # Then one reply is counted, for the second enrollment's message only
    stats = statistics(client, sequence_id)
    assert stats["completed"] == 2
    assert (stats["steps"][0]["messages"], stats["steps"][0]["replied"]) == (counts(sent=2), 1)


def test_statistics_count_stops_by_reason_and_ignore_other_sequences(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    # Given enrollments stopped by a reply, replaced by a re-entry, failed, and one in another sequence
    sequence_id = published(
        client, message_step("one"), message_step("two", delay_seconds=60), reentry="always"
    )
    other = published(client)
    replier, reentrant, failing = new_contact(client), new_contact(client), new_contact(client)
    for contact in (replier, reentrant, failing):
        enroll(client, sequence_id, contact)
    enroll(client, other, replier)
    release(runtime)
    inbound(client, replier)
    enroll(client, sequence_id, reentrant)
    with pool.connection() as conn:
        conn.execute(
            "UPDATE followup_enrollments SET status = 'failed', reason = 'error', finished_at = %s"
            " WHERE contact_id = %s",
            (clock.now(), failing),
        )
    clock.advance(timedelta(minutes=1))
    release(runtime)
    clock.advance(timedelta(minutes=1))
    release(runtime)

    stats = statistics(client, sequence_id)
    assert stats["enrolled"] == 4
    assert stats["stopped_by_reason"] == {"replied": 1, "reentered": 1}
    assert (stats["stopped"], stats["failed"], stats["active"]) == (2, 1, 0)
    assert stats["completed"] == 1  # the re-entered enrollment ran both steps
    # step 1: four messages, the replier's and the replaced enrollment's cancelled by their stops (the
    # other sequence's message is not counted)
    assert stats["steps"][0]["messages"] == counts(queued=2, cancelled=2)
    assert stats["steps"][1]["messages"] == counts(queued=1)
    assert stats["steps"][1]["stopped_by_reason"] == {"replied": 1, "reentered": 1}
