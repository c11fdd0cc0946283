"""Provider feedback on the controllable clock: a ``message.status`` ``FAILED`` with the provider's
``error_code`` changes what happens next, by class (docs/providers.md, "What a failure changes"): the
per-user marketing limit defers the contact's marketing follow-ups a day, outside the service window retries
the step once as its template (or skips it), undeliverable stops the contact's follow-ups and flags it, a
rate limit queues the message again and widens its number's pacing until it recovers; any other code is
recorded and counted only. Each action is in the message's timeline and counted."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups import pacing
from libs.common.platform.provider_errors import CODES, classify
from tests.release_helpers import Metrics
from tests.test_sending_constraints import (
    MONDAY,
    at,
    contact,
    enroll,
    enrollment,
    number,
    ok,
    release,
    rows,
    sequence,
)

ERRORS = "followups_provider_errors_total"
CLASSES = ("marketing_limit", "outside_service_window", "undeliverable", "rate_limit", "other")


def metrics() -> Metrics:
    return Metrics(*((ERRORS, {"code_class": c}) for c in CLASSES))


def report(client: TestClient[Any], message_id: str, status: str, **fields: Any) -> dict[str, Any]:
    body = {"type": "message.status", "message_id": message_id, "status": status, **fields}
    return ok(client.post("/v1/events", json=body))  # type: ignore[no-any-return]


def fail(client: TestClient[Any], message_id: str, code: str) -> dict[str, Any]:
    """The provider took the message (SENT), then reported it FAILED with ``code``."""
    report(client, message_id, "SENT", provider_message_id=f"wamid.{message_id}")
    return report(client, message_id, "FAILED", error_code=code, error=f"provider error {code}")


def message(client: TestClient[Any], message_id: str) -> dict[str, Any]:
    return ok(client.get(f"/v1/messages/{message_id}"))  # type: ignore[no-any-return]


def last_message(client: TestClient[Any], enrollment_id: str) -> str:
    return enrollment(client, enrollment_id)["messages"][-1]["id"]  # type: ignore[no-any-return]


def enrolled_on(client: TestClient[Any], sequence_id: str, number_id: str) -> str:
    """A new contact, in a conversation on ``number_id``, enrolled in the sequence: the enrollment."""
    c = contact(client)
    body = {"type": "conversation.created", "contact_id": c, "number_id": number_id}
    ok(client.post("/v1/events", json=body), 201)
    return enroll(client, sequence_id, c)


def actions(client: TestClient[Any], message_id: str) -> list[str]:
    """The actions in a message's timeline, in order."""
    return [c["action"] for c in message(client, message_id)["status_history"] if c["action"] is not None]


def test_the_code_table_classes_every_documented_code_and_nothing_else() -> None:
    assert classify("131049") == "marketing_limit"
    assert {classify(c) for c in ("131047", "470", "63016")} == {"outside_service_window"}
    assert {classify(c) for c in ("131026", "63003", "21211")} == {"undeliverable"}
    assert classify("130429") == "rate_limit"
    assert {classify(c) for c in ("132000", "190", "expired", "", None)} == {"other"}
    with open("docs/providers.md") as docs:
        documented = docs.read()
    for code in CODES:
        assert f"`{code}`" in documented, code


def test_a_131049_mid_sequence_defers_that_contacts_marketing_follow_ups_a_day_and_no_one_elses(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given two contacts in a three-step marketing sequence, and one of them in a utility sequence too
    clock.set(MONDAY)
    steps = [
        {"kind": "message", "text": f"Step {i}", "delay_seconds": 0 if i == 0 else 3600} for i in range(3)
    ]
    marketing = sequence(client, *steps)
    utility = sequence(
        client, {"kind": "message", "text": "Your order", "delay_seconds": 7200}, category="utility"
    )
    limited, other = contact(client), contact(client)
    on_limited, on_other = enroll(client, marketing, limited), enroll(client, marketing, other)
    receipt = enroll(client, utility, limited)
    release(runtime, clock)
    clock.advance(timedelta(hours=1))
    release(runtime, clock)  # step 1 of both
    counted = metrics()

    # When the provider refuses the limited contact's second message for its marketing limit
    failed_at = clock.now()
    result = fail(client, last_message(client, on_limited), "131049")

    # Then its marketing follow-ups wait a day, the other contact's and its own utility message do not
    until = failed_at + timedelta(hours=24)
    assert result["provider_action"] == f"marketing_deferred:{until.isoformat()}"
    assert actions(client, last_message(client, on_limited)) == [f"marketing_deferred:{until.isoformat()}"]
    assert counted.delta(ERRORS, code_class="marketing_limit") == 1
    clock.advance(timedelta(hours=1))
    release(runtime, clock)
    assert len(enrollment(client, on_other)["messages"]) == 3
    assert len(enrollment(client, receipt)["messages"]) == 1
    waiting = enrollment(client, on_limited)["enrollment"]
    assert (waiting["waiting_reason"], waiting["next_run_at"]) == ("user_marketing_limit", at(until))
    assert len(enrollment(client, on_limited)["messages"]) == 2
    # And a day after the refusal the sequence goes on
    clock.set(until)
    release(runtime, clock)
    assert len(enrollment(client, on_limited)["messages"]) == 3


def test_outside_the_window_a_step_is_retried_once_as_its_template_or_skipped(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given a step with an approved template and one without, sent free-form (the window not enforced)
    template = {"name": "order_reminder", "language": "pt_BR", "parameters": ["{{ vars.order }}"]}
    with_template = sequence(
        client, {"kind": "message", "text": "Any news, {{ vars.order }}?", "whatsapp_template": template}
    )
    without = sequence(client, {"kind": "message", "text": "Hello"})
    templated = enroll(client, with_template, contact(client), variables={"order": "A-17"})
    plain = enroll(client, without, contact(client))
    release(runtime, clock)
    counted = metrics()

    # When the provider refuses both as outside the 24-hour window (WhatsApp's 131047, Twilio's 63016)
    first = last_message(client, templated)
    retried = fail(client, first, "131047")
    skipped = fail(client, last_message(client, plain), "63016")

    # Then the templated step is queued again as its template, the other step is skipped
    [retry] = [m for m in enrollment(client, templated)["messages"] if m["id"] != first]
    assert retried["provider_action"] == f"template_retry:{retry['id']}"
    again = message(client, retry["id"])
    assert (again["status"], again["body"], again["template_name"]) == ("QUEUED", None, "order_reminder")
    assert (again["template_language"], again["template_parameters"]) == ("pt_BR", ["A-17"])
    assert [(r["outcome"], r["reason"]) for r in enrollment(client, templated)["step_runs"]] == [
        ("queued", "service_window_template")
    ]
    assert skipped["provider_action"] == "step_skipped:outside_service_window"
    assert [(r["outcome"], r["reason"]) for r in enrollment(client, plain)["step_runs"]] == [
        ("skipped", "outside_service_window")
    ]
    assert counted.delta(ERRORS, code_class="outside_service_window") == 2
    # And a template refused so is only recorded: the step is retried once
    assert fail(client, retry["id"], "131047")["provider_action"] == "recorded"
    assert len(enrollment(client, templated)["messages"]) == 2
    assert actions(client, first) == [f"template_retry:{retry['id']}"]


def test_an_undeliverable_contact_is_flagged_and_its_follow_ups_stop(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given a contact in two sequences, the second's message still QUEUED, and another contact
    first = sequence(
        client, {"kind": "message", "text": "One"}, {"kind": "message", "text": "Two", "delay_seconds": 60}
    )
    second = sequence(
        client, {"kind": "message", "text": "Other"}, {"kind": "message", "text": "More", "delay_seconds": 60}
    )
    gone, fine = contact(client), contact(client)
    on_first, on_second = enroll(client, first, gone), enroll(client, second, gone)
    unaffected = enroll(client, first, fine)
    release(runtime, clock)
    clock.advance(timedelta(seconds=6))  # the contact's spacing between its two sequences' messages
    release(runtime, clock)
    counted = metrics()

    # When the provider says the first message cannot be delivered
    result = fail(client, last_message(client, on_first), "131026")

    # Then the contact is flagged, its follow-ups stopped (undeliverable), its queued message cancelled
    assert result["provider_action"] == "contact_undeliverable:2"
    assert sorted(result["stopped_enrollment_ids"]) == sorted([on_first, on_second])
    assert ok(client.get(f"/v1/contacts/{gone}"))["undeliverable_at"] == at(clock.now())
    assert ok(client.get(f"/v1/contacts/{fine}"))["undeliverable_at"] is None
    for stopped in (on_first, on_second):
        read = enrollment(client, stopped)["enrollment"]
        assert (read["status"], read["reason"]) == ("stopped", "undeliverable")
    assert message(client, last_message(client, on_second))["status"] == "CANCELLED"
    assert counted.delta(ERRORS, code_class="undeliverable") == 1
    # And a later enrollment stops at its first release, while the other contact's sequence goes on
    later = enroll(client, second, gone)
    clock.advance(timedelta(minutes=2))
    release(runtime, clock)
    assert (enrollment(client, later)["enrollment"]["reason"], enrollment(client, later)["messages"]) == (
        "undeliverable",
        [],
    )
    assert len(enrollment(client, unaffected)["messages"]) == 2


def test_a_130429_burst_widens_the_numbers_pacing_then_it_recovers(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given a number with no pacing configured and three follow-ups sent from it
    clock.set(MONDAY)
    paced = number(client, "+15550000301")
    seq = sequence(client, {"kind": "message", "text": "Hi"})
    sent = []
    for _ in range(3):
        sent.append(enrolled_on(client, seq, paced))
    release(runtime, clock)
    counted = metrics()

    # When the provider rate-limits all three (130429)
    gaps = []
    for e in sent:
        result = fail(client, last_message(client, e), "130429")
        gaps.append(result["provider_action"])
        assert (result["status"], message(client, last_message(client, e))["status"]) == ("QUEUED", "QUEUED")

    # Then each is queued again, and the number's gap doubles from the floor at each one
    assert gaps == ["requeued:1000", "requeued:2000", "requeued:4000"]
    assert counted.delta(ERRORS, code_class="rate_limit") == 3
    assert actions(client, last_message(client, sent[0])) == ["requeued"]
    # And the widened gap holds follow-ups on the number apart: the next two are a gap apart
    later = []
    for _ in range(2):
        later.append(enrolled_on(client, seq, paced))
    clock.advance(timedelta(seconds=4))
    release(runtime, clock)
    waits = sorted(enrollment(client, e)["enrollment"]["next_run_at"] or "" for e in later)
    assert waits == ["", at(clock.now() + timedelta(seconds=4))]
    # And it recovers by halves, a minute each, back to the project's gap (none) below the floor
    widened_at = MONDAY
    pairs = [(r, pacing.gap_ms(0, 4000, widened_at, widened_at + timedelta(minutes=r))) for r in range(4)]
    assert pairs == [(0, 4000), (1, 2000), (2, 1000), (3, 0)]
    assert pacing.gap_ms(1500, 4000, widened_at, widened_at + timedelta(minutes=2)) == 1500
    clock.set(MONDAY + timedelta(minutes=4))
    again = []
    for _ in range(2):
        again.append(enrolled_on(client, seq, paced))
    release(runtime, clock)
    assert all(len(enrollment(client, e)["messages"]) == 1 for e in again)


@pytest.mark.parametrize("code", ["132000", "expired", "999999"])
def test_any_other_code_is_recorded_and_counted_only(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock, code: str
) -> None:
    seq = sequence(
        client, {"kind": "message", "text": "One"}, {"kind": "message", "text": "Two", "delay_seconds": 60}
    )
    enrolled = enroll(client, seq, contact(client))
    release(runtime, clock)
    counted = metrics()
    failed = last_message(client, enrolled)
    assert fail(client, failed, code)["provider_action"] == "recorded"
    assert counted.delta(ERRORS, code_class="other") == 1
    assert actions(client, failed) == ["recorded"]
    assert message(client, failed)["error_code"] == code
    clock.advance(timedelta(minutes=1))
    release(runtime, clock)
    assert len(enrollment(client, enrolled)["messages"]) == 2
    # a failure without a code, or a repeated one, acts on nothing
    assert report(client, failed, "FAILED", error_code=code)["provider_action"] is None
    assert (
        rows(runtime.pool, "SELECT count(*) FROM message_status_events WHERE action IS NOT NULL")[0][0] == 1
    )


def test_a_template_retry_while_the_conversation_is_held_is_answered_busy_and_applies_when_sent_again(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given a step with an approved template sent free-form, and another transaction holding the contact's
    # open conversation (a reply being recorded, say)
    template = {"name": "order_reminder", "language": "pt_BR", "parameters": ["{{ vars.order }}"]}
    with_template = sequence(
        client, {"kind": "message", "text": "Any news, {{ vars.order }}?", "whatsapp_template": template}
    )
    templated = enroll(client, with_template, contact(client), variables={"order": "A-17"})
    release(runtime, clock)
    first = last_message(client, templated)
    report(client, first, "SENT", provider_message_id=f"wamid.{first}")
    with runtime.pool.connection() as holder:
        holder.execute(
            "SELECT 1 FROM conversations WHERE id = (SELECT conversation_id FROM messages WHERE id = %s)"
            " FOR UPDATE",
            (first,),
        )

        # When the provider reports it outside the window meanwhile
        body = {"type": "message.status", "message_id": first, "status": "FAILED", "error_code": "131047"}
        busy = client.post("/v1/events", json=body)

        # Then the platform is told to send it again in a moment, and nothing of it is kept
        assert busy.status_code == 429, busy.text
        assert busy.headers["retry-after"]
        assert busy.json()["code"] == "busy"
        assert message(client, first)["status"] == "SENT"
        assert len(enrollment(client, templated)["messages"]) == 1

    # And sent again once the conversation is free, it is applied: the step is retried as its template
    retried = report(client, first, "FAILED", error_code="131047")
    [retry] = [m for m in enrollment(client, templated)["messages"] if m["id"] != first]
    assert retried["provider_action"] == f"template_retry:{retry['id']}"
    assert message(client, first)["status"] == "FAILED"


def test_a_rate_limited_follow_up_is_not_sent_again_after_a_reply_or_for_a_late_report(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given two contacts each sent a two-step sequence's first follow-up
    clock.set(MONDAY)
    seq = sequence(client, {"kind": "message", "text": "Hi"}, {"kind": "message", "text": "Again?"})
    replied_contact, other_contact = contact(client), contact(client)
    replied, other = enroll(client, seq, replied_contact), enroll(client, seq, other_contact)
    release(runtime, clock)
    first, second = last_message(client, replied), last_message(client, other)
    for m in (first, second):
        report(client, m, "SENT", provider_message_id=f"wamid.{m}")

    # When the first contact replies, then the provider rate-limits the follow-up it was sent (130429)
    clock.advance(timedelta(seconds=1))
    ok(
        client.post(
            "/v1/events",
            json={"type": "message.inbound", "contact_id": replied_contact, "provider_message_id": "in-1"},
        ),
        201,
    )
    after_reply = fail(client, first, "130429")

    # Then it is not queued again: it failed, the number is paced, the reply stopped the sequence
    assert after_reply["status"] == "FAILED" and message(client, first)["status"] == "FAILED"
    assert enrollment(client, replied)["enrollment"]["status"] == "stopped"

    # And a rate limit reported for an attempt the provider no longer holds (a late report of an earlier
    # attempt) leaves the message as it is, and reports by our id alone queue it again at most 3 times
    stale = report(
        client, second, "FAILED", provider_message_id="wamid.earlier", error_code="130429", error="late"
    )
    assert message(client, second)["status"] == "FAILED" and stale["status"] == "FAILED"


def test_a_rate_limit_reported_again_and_again_by_our_id_queues_the_message_again_at_most_three_times(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    clock.set(MONDAY)
    seq = sequence(client, {"kind": "message", "text": "Hi"})
    enrolled = enroll(client, seq, contact(client))
    release(runtime, clock)
    sent = last_message(client, enrolled)
    statuses = []
    for attempt in range(5):
        report(client, sent, "SENT", provider_message_id=f"wamid.{attempt}")
        statuses.append(report(client, sent, "FAILED", error_code="130429", error="rate limit")["status"])
    assert statuses == ["QUEUED", "QUEUED", "QUEUED", "FAILED", "FAILED"]
    assert actions(client, sent).count("requeued") == 3
