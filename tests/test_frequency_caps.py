"""One frequency policy on the controllable clock: caps per contact per rolling 24 hours and per calendar
day in the contact's zone, over every message the engine sends (sequences, one-offs, rules), holding back
marketing messages only (utility and service pass); the deferral's reason on the enrollment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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
    sequence,
)

GAP = timedelta(seconds=6)


def test_the_24_hour_cap_counts_rules_one_offs_and_sequences_and_holds_back_marketing_only(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given a cap of 2 messages a contact in 24 h, and a rule that writes when a contact is tagged
    put_settings(client, max_per_contact_24h=2)
    create_rule(client, "contact.tag_added", [{"type": "send_message", "text": "Thanks"}])
    someone = contact(client)
    first_at = clock.now()
    ok(client.post(f"/v1/contacts/{someone}/tags", json={"tags": ["a"]}))
    assert process(runtime) == 1  # the rule's message: 1
    clock.advance(GAP)
    one_off = {"contact_id": someone, "steps": [{"kind": "message", "text": "One-off"}]}
    ok(client.post("/v1/enrollments", json=one_off), 201)
    release(runtime, clock)  # the one-off's: 2
    clock.advance(GAP)

    # When a marketing sequence and a utility one reach the contact
    marketing = enroll(client, sequence(client, {"kind": "message", "text": "Promo"}), someone)
    receipt = enroll(
        client, sequence(client, {"kind": "message", "text": "Receipt"}, category="utility"), someone
    )
    release(runtime, clock)

    # Then the marketing step waits until the first of the two is 24 hours old; the utility one goes
    held = enrollment(client, marketing)["enrollment"]
    assert (held["waiting_reason"], held["next_run_at"]) == (
        "contact_cap",
        at(first_at + timedelta(hours=24)),
    )
    assert len(enrollment(client, receipt)["messages"]) == 1
    clock.set(first_at + timedelta(hours=24))
    release(runtime, clock)
    assert enrollment(client, marketing)["enrollment"]["waiting_reason"] == "contact_cap"  # two still inside
    clock.set(first_at + timedelta(hours=24) + GAP)
    release(runtime, clock)
    assert len(enrollment(client, marketing)["messages"]) == 1


def test_the_day_cap_is_a_calendar_day_in_the_contacts_zone_for_rules_and_follow_ups(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given one marketing message a day, and a contact in Sao Paulo (UTC-3) at 20:00 its time
    put_settings(client, max_per_contact_day=1)
    clock.set(datetime(2030, 1, 7, 23, 0, tzinfo=UTC))
    paulista = contact(client, timezone="America/Sao_Paulo")
    steps: list[dict[str, Any]] = [
        {"kind": "message", "text": "One"},
        {"kind": "message", "text": "Two", "delay_seconds": 60},
    ]
    enrolled = enroll(client, sequence(client, *steps), paulista)
    release(runtime, clock)
    promo = create_rule(client, "contact.tag_added", [{"type": "send_message", "text": "Promo"}])
    notice = create_rule(
        client, "contact.tag_added", [{"type": "send_message", "text": "Notice", "category": "service"}]
    )

    # When its second step falls due and a rule writes to it the same local evening
    clock.advance(timedelta(minutes=1))
    release(runtime, clock)
    ok(client.post(f"/v1/contacts/{paulista}/tags", json={"tags": ["x"]}))
    process(runtime)

    # Then the step waits for midnight in Sao Paulo (03:00 UTC), the rule's marketing message is refused,
    # its service message goes
    waiting = enrollment(client, enrolled)["enrollment"]
    midnight = datetime(2030, 1, 8, 3, 0, tzinfo=UTC)
    assert (waiting["waiting_reason"], waiting["next_run_at"]) == ("contact_day_cap", at(midnight))
    assert runs(client, promo) == [("rejected", "contact_day_cap")]
    assert runs(client, notice) == [("executed", None)]
    assert [m["body"] for m in rule_messages(runtime, paulista)] == ["Notice"]
    clock.set(midnight)
    release(runtime, clock)
    assert len(enrollment(client, enrolled)["messages"]) == 2


def test_the_caps_are_settings_checked_and_shown(client: TestClient[Any]) -> None:
    put_settings(client, max_per_contact_24h=5, max_per_contact_day=3)
    read = ok(client.get("/v1/settings"))
    assert (read["max_per_contact_24h"], read["max_per_contact_day"]) == (5, 3)
    response = client.put("/v1/settings", json={"max_per_contact_day": 0})
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["max_per_contact_day"]
    assert ok(client.get("/v1/settings"))["max_per_contact_day"] == 3
