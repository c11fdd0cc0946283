"""Spacing per recipient on the controllable clock: consecutive messages to one contact at least
``min_recipient_gap_seconds`` apart (default 6, WhatsApp's pace per user), whatever sends them: sequences,
one-offs, rules."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise
from typing import Any

from litestar.testing import TestClient

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from tests.rule_helpers import create_rule, process
from tests.rule_trigger_helpers import rule_messages, runs
from tests.test_sending_constraints import (
    at,
    contact,
    enroll,
    enrollment,
    ok,
    put_settings,
    release,
    rows,
    sequence,
)


def sent_at(runtime: Runtime, contact_id: str) -> list[Any]:
    """When each outbound message to the contact was queued, oldest first."""
    sql = (
        "SELECT created_at FROM messages WHERE contact_id = %s AND direction = 'outbound' ORDER BY created_at"
    )
    return [r[0] for r in rows(runtime.pool, sql, contact_id)]


def test_two_sequences_and_a_one_off_to_one_contact_go_six_seconds_apart(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given one contact enrolled at once in two sequences and a one-off, and another contact
    both = contact(client)
    first = enroll(client, sequence(client, {"kind": "message", "text": "A"}), both)
    second = enroll(client, sequence(client, {"kind": "message", "text": "B"}), both)
    one_off = ok(
        client.post(
            "/v1/enrollments", json={"contact_id": both, "steps": [{"kind": "message", "text": "C"}]}
        ),
        201,
    )["id"]
    alone = enroll(client, sequence(client, {"kind": "message", "text": "D"}), contact(client))
    start = clock.now()

    # When the release runs: one message goes to the contact, the others wait for its gap
    release(runtime, clock)
    assert len(enrollment(client, alone)["messages"]) == 1
    waiting = [enrollment(client, e)["enrollment"] for e in (first, second, one_off)]
    assert sorted(w["waiting_reason"] or "" for w in waiting) == ["", "recipient_gap", "recipient_gap"]
    assert {w["next_run_at"] for w in waiting if w["waiting_reason"]} == {at(start + timedelta(seconds=6))}

    # Then each gap lets one more go, never two within six seconds
    for _ in range(3):
        clock.advance(timedelta(seconds=6))
        release(runtime, clock)
    times = sent_at(runtime, both)
    assert len(times) == 3
    assert [b - a for a, b in pairwise(times)] == [timedelta(seconds=6)] * 2


def test_consecutive_steps_keep_the_gap_and_a_project_may_turn_it_off_or_widen_it(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    steps = ({"kind": "message", "text": "One"}, {"kind": "message", "text": "Two"})
    spaced = enroll(client, sequence(client, *steps), contact(client))
    release(runtime, clock)
    assert enrollment(client, spaced)["enrollment"]["next_run_at"] == at(clock.now() + timedelta(seconds=6))

    put_settings(client, min_recipient_gap_seconds=0)
    assert ok(client.get("/v1/settings"))["min_recipient_gap_seconds"] == 0
    unspaced = enroll(client, sequence(client, *steps), contact(client))
    release(runtime, clock)
    release(runtime, clock)
    assert len(enrollment(client, unspaced)["messages"]) == 2

    put_settings(client, min_recipient_gap_seconds=60)
    wide = enroll(client, sequence(client, *steps), contact(client))
    release(runtime, clock)
    assert enrollment(client, wide)["enrollment"]["next_run_at"] == at(clock.now() + timedelta(seconds=60))
    for bad, status in ((-1, 422), (86401, 422), ("6", 400)):  # out of range; not a number
        response = client.put("/v1/settings", json={"min_recipient_gap_seconds": bad})
        assert response.status_code == status, response.text
        assert [e["field"] for e in response.json()["errors"]] == ["min_recipient_gap_seconds"]
    assert ok(client.get("/v1/settings"))["min_recipient_gap_seconds"] == 60


def test_a_rules_message_and_a_follow_up_keep_the_gap_either_way(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given a rule that writes to a contact when it is tagged
    sender = create_rule(client, "contact.tag_added", [{"type": "send_message", "text": "Thanks"}])
    someone = contact(client)

    # When the rule writes, a follow-up enrolled just after waits for the gap
    ok(client.post(f"/v1/contacts/{someone}/tags", json={"tags": ["a"]}))
    assert process(runtime) == 1
    assert len(rule_messages(runtime, someone)) == 1
    follow_up = enroll(client, sequence(client, {"kind": "message", "text": "Hi"}), someone)
    release(runtime, clock)
    assert enrollment(client, follow_up)["enrollment"]["waiting_reason"] == "recipient_gap"
    clock.advance(timedelta(seconds=6))
    release(runtime, clock)
    assert len(enrollment(client, follow_up)["messages"]) == 1

    # And the rule's next message, within the gap of that follow-up, is retried, then sent
    ok(client.post(f"/v1/contacts/{someone}/tags", json={"tags": ["b"]}))
    assert process(runtime) == 1
    assert len(rule_messages(runtime, someone)) == 1
    [(error,)] = rows(runtime.pool, "SELECT last_error FROM followup_triggers WHERE processed_at IS NULL")
    assert "RecipientGap" in error
    clock.advance(timedelta(minutes=1))  # the trigger's backoff
    assert process(runtime) == 1
    assert len(rule_messages(runtime, someone)) == 2
    assert runs(client, sender) == [("executed", None), ("executed", None)]
    times = sent_at(runtime, someone)
    assert all(b - a >= timedelta(seconds=6) for a, b in pairwise(times))
