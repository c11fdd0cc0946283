"""Sending constraints at release, driven through the API on the controllable clock: send window, consent,
the WhatsApp service window, number choice, pacing, the in-flight window, quota and backlog, the
per-contact cap; and what the enrollment read says while it waits."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.core.settings import FollowupSettings
from services.release.release import release_batch, release_one
from tests.conftest import Project

SETTINGS = FollowupSettings()
#: A Monday.
MONDAY = datetime(2030, 1, 7, tzinfo=UTC)


def rows(pool: ConnectionPool, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with pool.connection() as conn:
        return conn.execute(sql, params).fetchall()


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def put_settings(client: TestClient[Any], **settings: Any) -> dict[str, Any]:
    return ok(client.put("/v1/settings", json=settings))  # type: ignore[no-any-return]


def contact(client: TestClient[Any], **fields: Any) -> str:
    phone = fields.pop("phone", f"+1555{uuid.uuid4().int % 10**7:07d}")
    return ok(client.post("/v1/contacts", json={"phone": phone, **fields}), 201)["id"]  # type: ignore[no-any-return]


def sequence(client: TestClient[Any], *steps: dict[str, Any], **definition: Any) -> str:
    steps = steps or ({"kind": "message", "text": "Hello"},)
    created = ok(
        client.post("/v1/sequences", json={"name": "s", "definition": {"steps": list(steps), **definition}}),
        201,
    )
    ok(client.post(f"/v1/sequences/{created['id']}/publish"), 201)
    return created["id"]  # type: ignore[no-any-return]


def enroll(client: TestClient[Any], sequence_id: str, contact_id: str, **fields: Any) -> str:
    body = {"sequence_id": sequence_id, "contact_id": contact_id, **fields}
    return ok(client.post("/v1/enrollments", json=body), 201)["id"]  # type: ignore[no-any-return]


def enrollment(client: TestClient[Any], enrollment_id: str) -> dict[str, Any]:
    return ok(client.get(f"/v1/enrollments/{enrollment_id}"))  # type: ignore[no-any-return]


def number(client: TestClient[Any], phone: str, **fields: Any) -> str:
    return ok(client.post("/v1/numbers", json={"phone": phone, **fields}), 201)["id"]  # type: ignore[no-any-return]


def release(runtime: Runtime, clock: ManualClock) -> int:
    return release_batch(runtime.pool, clock, SETTINGS)


def at(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


# --- settings ---------------------------------------------------------------------------------------------


def test_settings_default_to_no_constraint_and_are_replaced_whole(client: TestClient[Any]) -> None:
    defaults = ok(client.get("/v1/settings"))
    assert defaults == {
        "timezone": "UTC",
        "send_window": None,
        "consent_mode": "off",
        "service_window": "off",
        "max_per_contact_24h": None,
        "max_per_contact_day": None,
        "min_recipient_gap_seconds": 6,
        "send_delay_ms": 0,
        "max_in_flight_per_number": None,
        "monthly_message_quota": None,
        "max_send_lane_backlog": None,
        "retention_days": 90,
        "business_hours": None,
        "ai_monthly_token_budget": None,
        "message_prices": None,
    }
    window = {"start": "21:00", "end": "08:00", "days": ["mon", "fri"]}
    put_settings(client, send_window=window, consent_mode="required", max_per_contact_24h=3)
    assert ok(client.get("/v1/settings")) | {} == defaults | {
        "send_window": window,
        "consent_mode": "required",
        "max_per_contact_24h": 3,
    }
    put_settings(client, send_delay_ms=500)  # PUT replaces: what is not given is back to its default
    assert ok(client.get("/v1/settings")) == defaults | {"send_delay_ms": 500}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"send_window": {"start": "09:00", "end": "09:00"}}, "send_window"),
        ({"send_window": {"start": "9am", "end": "17:00"}}, "send_window.start"),
        ({"send_window": {"start": "09:00", "end": "17:00", "days": ["someday"]}}, "send_window.days.0"),
        ({"send_window": {"start": "09:00", "end": "17:00", "days": []}}, "send_window.days"),
        ({"consent_mode": "maybe"}, "consent_mode"),
        ({"send_delay_ms": -1}, "send_delay_ms"),
        ({"max_per_contact_24h": 0}, "max_per_contact_24h"),
        ({"monthly_message_quota": 10**12}, "monthly_message_quota"),
        ({"retention_days": 0}, "retention_days"),
    ],
)
def test_bad_settings_are_a_422_naming_the_field_and_nothing_is_saved(
    client: TestClient[Any], body: dict[str, Any], field: str
) -> None:
    put_settings(client, send_delay_ms=250)
    response = client.put("/v1/settings", json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in response.json()["errors"]] == [field]
    assert ok(client.get("/v1/settings"))["send_delay_ms"] == 250


# --- send window ------------------------------------------------------------------------------------------


def test_outside_the_window_a_step_is_deferred_to_its_opening_never_skipped(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given a 09:00-17:00 window and a contact in Lisbon (UTC+0 in January), enrolled at 03:00
    put_settings(client, send_window={"start": "09:00", "end": "17:00"})
    clock.set(MONDAY.replace(hour=3))
    enrolled = enroll(client, sequence(client), contact(client, timezone="Europe/Lisbon"))
    # When the release runs at 03:00, Then the step waits for 09:00 and says why
    release(runtime, clock)
    read = enrollment(client, enrolled)["enrollment"]
    assert (read["next_run_at"], read["waiting_reason"]) == (at(MONDAY.replace(hour=9)), "send_window")
    assert enrollment(client, enrolled)["messages"] == []
    # When 09:00 comes, Then it is sent; its step run keeps the scheduled 03:00 (the lag shows the wait)
    clock.set(MONDAY.replace(hour=9))
    release(runtime, clock)
    detail = enrollment(client, enrolled)
    assert [m["status"] for m in detail["messages"]] == ["QUEUED"]
    assert [(r["outcome"], r["due_at"]) for r in detail["step_runs"]] == [
        ("queued", at(MONDAY.replace(hour=3)))
    ]


def test_advancing_to_the_next_step_applies_the_window(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, send_window={"start": "09:00", "end": "17:00"})
    clock.set(MONDAY.replace(hour=10))
    steps = (
        {"kind": "message", "text": "one"},
        {"kind": "message", "text": "two", "delay_seconds": 8 * 3600},
    )
    enrolled = enroll(client, sequence(client, *steps), contact(client, timezone="Europe/Lisbon"))
    release(runtime, clock)
    # 10:00 + 8 h = 18:00, after the window: the next step is scheduled at Tuesday's opening
    assert enrollment(client, enrolled)["enrollment"]["next_run_at"] == at(MONDAY.replace(day=8, hour=9))


def test_a_step_window_overrides_the_sequence_and_the_project_window_and_uses_the_contact_zone(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, send_window={"start": "00:00", "end": "23:59"})
    step = {"kind": "message", "text": "morning only", "send_window": {"start": "09:00", "end": "12:00"}}
    seq = sequence(client, step, send_window={"start": "13:00", "end": "14:00"})
    clock.set(MONDAY.replace(hour=13))  # 08:00 in New York
    enrolled = enroll(client, seq, contact(client, timezone="America/New_York"))
    release(runtime, clock)
    assert enrollment(client, enrolled)["enrollment"]["next_run_at"] == at(
        MONDAY.replace(hour=14)
    )  # 09:00 NY


def test_a_contact_without_a_zone_is_in_the_projects_zone(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock, pool: ConnectionPool, project: Project
) -> None:
    settings = put_settings(
        client, timezone="America/New_York", send_window={"start": "09:00", "end": "17:00"}
    )
    assert settings["timezone"] == "America/New_York"
    clock.set(MONDAY.replace(hour=13))  # 08:00 in New York
    enrolled = enroll(client, sequence(client), contact(client))
    release(runtime, clock)
    assert enrollment(client, enrolled)["enrollment"]["next_run_at"] == at(MONDAY.replace(hour=14))


def test_a_window_crossing_midnight_on_excluded_weekdays_waits_for_its_day(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, send_window={"start": "21:00", "end": "08:00", "days": ["fri"]})
    clock.set(MONDAY.replace(hour=22))  # inside the hours, but on a Monday
    enrolled = enroll(client, sequence(client), contact(client, timezone="Europe/Lisbon"))
    release(runtime, clock)
    friday_night = MONDAY.replace(day=11, hour=21)
    assert enrollment(client, enrolled)["enrollment"]["next_run_at"] == at(friday_night)
    clock.set(MONDAY.replace(day=12, hour=7, minute=30))  # Saturday 07:30: still Friday's window
    release(runtime, clock)
    assert len(enrollment(client, enrolled)["messages"]) == 1


def test_on_the_spring_forward_night_a_window_in_the_gap_opens_when_the_clock_jumps(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # New York 2030-03-10: 02:00 EST becomes 03:00 EDT at 07:00 UTC; 02:30 never happens
    put_settings(client, send_window={"start": "02:30", "end": "06:00"})
    clock.set(datetime(2030, 3, 10, 5, 0, tzinfo=UTC))  # 00:00 EST
    enrolled = enroll(client, sequence(client), contact(client, timezone="America/New_York"))
    release(runtime, clock)
    assert enrollment(client, enrolled)["enrollment"]["next_run_at"] == at(
        datetime(2030, 3, 10, 7, 0, tzinfo=UTC)
    )


# --- consent and the service window -----------------------------------------------------------------------


def test_consent_required_skips_a_contact_without_granted_consent(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, consent_mode="required")
    seq = sequence(client)
    unknown = enroll(client, seq, contact(client))
    granted_contact = contact(client)
    ok(client.post("/v1/events", json={"type": "contact.opted_in", "contact_id": granted_contact}))
    granted = enroll(client, seq, granted_contact)
    release(runtime, clock)
    skipped = enrollment(client, unknown)
    assert [(r["outcome"], r["reason"]) for r in skipped["step_runs"]] == [("skipped", "no_consent")]
    assert skipped["messages"] == []
    assert len(enrollment(client, granted)["messages"]) == 1


def test_outside_the_service_window_a_step_goes_as_its_approved_template_or_is_skipped(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, service_window="enforced")
    template = {"name": "order_reminder", "language": "pt_BR", "parameters": ["{{ vars.order }}"]}
    with_template = sequence(
        client, {"kind": "message", "text": "Any news, {{ vars.order }}?", "whatsapp_template": template}
    )
    without = sequence(client, {"kind": "message", "text": "Hello"})
    silent = contact(client)  # never wrote
    templated = enroll(client, with_template, silent, variables={"order": "A-17"})
    skipped = enroll(client, without, silent)
    recent = contact(client)
    ok(
        client.post(
            "/v1/events",
            json={"type": "message.inbound", "contact_id": recent, "provider_message_id": "in-1"},
        ),
        201,
    )
    clock.advance(timedelta(hours=1))
    free_form = enroll(client, without, recent)
    release(runtime, clock)

    assert [(r["outcome"], r["reason"]) for r in enrollment(client, skipped)["step_runs"]] == [
        ("skipped", "outside_service_window")
    ]
    assert [r["reason"] for r in enrollment(client, templated)["step_runs"]] == ["service_window_template"]
    claimed = {
        m["followup_enrollment_id"]: m
        for m in ok(client.post("/v1/send-lane/claim", json={"limit": 10}))["items"]
    }
    assert (claimed[templated]["body"], claimed[templated]["template_name"]) == (None, "order_reminder")
    assert (claimed[templated]["template_language"], claimed[templated]["template_parameters"]) == (
        "pt_BR",
        ["A-17"],
    )
    assert (claimed[free_form]["body"], claimed[free_form]["template_name"]) == ("Hello", None)


def test_the_service_window_closes_24_hours_after_the_contacts_last_message(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    """When the contact last wrote is the contact's own column, set by each reply: a second message moves
    the window on, and 24 hours after the last one it is closed."""
    put_settings(client, service_window="enforced")
    plain = sequence(client, {"kind": "message", "text": "Hello"})
    wrote = contact(client)
    for provider_id in ("in-1", "in-2"):
        ok(
            client.post(
                "/v1/events",
                json={"type": "message.inbound", "contact_id": wrote, "provider_message_id": provider_id},
            ),
            201,
        )
        clock.advance(timedelta(hours=20))
    # 20 h after the second message (40 h after the first): still open
    inside = enroll(client, plain, wrote)
    release(runtime, clock)
    assert [r["outcome"] for r in enrollment(client, inside)["step_runs"]] == ["queued"]
    clock.advance(timedelta(hours=4, minutes=1))
    outside = enroll(client, sequence(client, {"kind": "message", "text": "Later"}), wrote)
    release(runtime, clock)
    assert [(r["outcome"], r["reason"]) for r in enrollment(client, outside)["step_runs"]] == [
        ("skipped", "outside_service_window")
    ]


# --- number choice ----------------------------------------------------------------------------------------


def test_the_number_is_the_enrollments_then_the_sequences_then_the_conversations_then_the_default(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    first = number(client, "+15550000001")
    default = number(client, "+15550000002", is_default=True)
    fixed = number(client, "+15550000003")
    pinned = number(client, "+15550000004")
    chatting = number(client, "+15550000005")
    plain, with_fixed = sequence(client), sequence(client, number_id=fixed)
    cases = {
        "default": enroll(client, plain, contact(client)),
        "fixed": enroll(client, with_fixed, contact(client)),
        "pinned": enroll(client, with_fixed, contact(client), number_id=pinned),
    }
    talker = contact(client)
    ok(
        client.post(
            "/v1/events", json={"type": "conversation.created", "contact_id": talker, "number_id": chatting}
        ),
        201,
    )
    cases["conversation"] = enroll(client, plain, talker)
    release(runtime, clock)
    used = {
        case: rows(runtime.pool, "SELECT number_id::text FROM messages WHERE followup_enrollment_id = %s", e)[
            0
        ][0]
        for case, e in cases.items()
    }
    assert used == {"default": default, "fixed": fixed, "pinned": pinned, "conversation": chatting}
    # a disconnected choice falls through to the next usable one: here the only one left connected
    for gone in (default, fixed, pinned, chatting):
        ok(client.post("/v1/events", json={"type": "number.disconnected", "number_id": gone}))
    late = enroll(client, with_fixed, talker)
    clock.advance(timedelta(seconds=6))  # the talker's spacing after its first follow-up
    release(runtime, clock)
    sql = "SELECT number_id::text FROM messages WHERE followup_enrollment_id = %s"
    assert rows(runtime.pool, sql, late) == [(first,)]


def test_without_a_usable_number_it_retries_every_15_s_pauses_after_30_min_and_resumes_on_connect(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    only = number(client, "+15550000009", status="disconnected")
    enrolled = enroll(client, sequence(client), contact(client))
    start = clock.now()
    release(runtime, clock)
    read = enrollment(client, enrolled)["enrollment"]
    assert (read["waiting_reason"], read["next_run_at"]) == (
        "instance_unavailable",
        at(start + timedelta(seconds=15)),
    )
    clock.advance(timedelta(minutes=29, seconds=59))
    release(runtime, clock)
    assert enrollment(client, enrolled)["enrollment"]["status"] == "active"
    clock.advance(timedelta(seconds=15))
    release(runtime, clock)
    paused = enrollment(client, enrolled)["enrollment"]
    assert (paused["status"], paused["reason"]) == ("paused", "instance_unavailable")
    # a manual pause is not resumed by a number connecting; the number's pause is
    other = enroll(client, sequence(client), contact(client))
    ok(client.post(f"/v1/enrollments/{other}/pause"))
    result = ok(client.post("/v1/events", json={"type": "number.connected", "number_id": only}))
    assert result["resumed_enrollment_ids"] == [enrolled]
    assert enrollment(client, other)["enrollment"]["status"] == "paused"
    release(runtime, clock)
    assert len(enrollment(client, enrolled)["messages"]) == 1


def test_numbers_of_another_project_or_unknown_are_404_naming_the_field(
    client: TestClient[Any], other_project: Project
) -> None:
    theirs = ok(
        client.post("/v1/numbers", json={"phone": "+15550000077"}, headers=other_project.headers), 201
    )["id"]
    response = client.post("/v1/sequences", json={"name": "s", "definition": {"number_id": theirs}})
    assert (response.status_code, response.json()["errors"][0]["field"]) == (404, "definition.number_id")
    response = client.post(
        "/v1/enrollments",
        json={"sequence_id": sequence(client), "contact_id": contact(client), "number_id": theirs},
    )
    assert (response.status_code, response.json()["errors"][0]["field"]) == (404, "number_id")
    assert client.get(f"/v1/numbers/{theirs}").status_code == 404
    response = client.post("/v1/events", json={"type": "number.connected", "number_id": str(uuid.uuid4())})
    assert (response.status_code, response.json()["errors"][0]["field"]) == (404, "number_id")


def test_the_numbers_api_registers_lists_and_keeps_one_default(client: TestClient[Any]) -> None:
    a = number(client, "+15550000101", name="Sales", is_default=True)
    b = number(client, "+15550000102")
    ok(client.patch(f"/v1/numbers/{b}", json={"is_default": True, "name": "Support"}))
    listed = {n["id"]: n for n in ok(client.get("/v1/numbers"))["items"]}
    assert (listed[a]["is_default"], listed[b]["is_default"], listed[b]["name"]) == (False, True, "Support")
    assert client.post("/v1/numbers", json={"phone": "+15550000101"}).status_code == 409
    response = client.post("/v1/numbers", json={"phone": "not a phone"})
    assert (response.status_code, response.json()["errors"][0]["field"]) == (422, "phone")
    response = client.patch(f"/v1/numbers/{a}", json={"status": "asleep"})
    assert (response.status_code, response.json()["errors"][0]["field"]) == (422, "status")


# --- pacing -----------------------------------------------------------------------------------------------


def test_a_paced_number_releases_one_follow_up_per_gap_without_starving_a_free_number(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given a 60 s pacing gap, ten contacts talking on number A and one on number B
    put_settings(client, send_delay_ms=60_000)
    a, b = number(client, "+15550000201"), number(client, "+15550000202")
    seq = sequence(client)
    on_a = []
    for _ in range(10):
        c = contact(client)
        ok(
            client.post("/v1/events", json={"type": "conversation.created", "contact_id": c, "number_id": a}),
            201,
        )
        on_a.append(enroll(client, seq, c))
    c = contact(client)
    ok(client.post("/v1/events", json={"type": "conversation.created", "contact_id": c, "number_id": b}), 201)
    on_b = enroll(client, seq, c)

    # When the release runs: each enrollment is handled once (one sends per number, the rest reserve a slot)
    assert release(runtime, clock) == 11
    assert len(enrollment(client, on_b)["messages"]) == 1
    queued_on = lambda n: rows(runtime.pool, "SELECT count(*) FROM messages WHERE number_id = %s", n)[0][0]  # noqa: E731
    assert queued_on(a) == 1
    runs = [enrollment(client, e)["enrollment"]["next_run_at"] for e in on_a]
    assert runs.count(None) == 1  # the one that sent has nothing left to do (a one-step sequence)
    slots = sorted(run for run in runs if run is not None)
    start = clock.now()
    assert slots == [at(start + timedelta(minutes=i)) for i in range(1, 10)]  # one slot a gap
    assert {enrollment(client, e)["enrollment"]["waiting_reason"] for e in on_a[1:]} <= {"pacing", None}
    # Then nothing is picked again inside the gap, and each gap releases exactly one more on A
    assert release_one(runtime.pool, clock, SETTINGS) is None
    for minute in range(1, 10):
        clock.set(start + timedelta(minutes=minute))
        assert release(runtime, clock) == 1
        assert queued_on(a) == 1 + minute


# --- in-flight window, quota, backlog, per-contact cap ---------------------------------------------------


def test_the_in_flight_window_holds_follow_ups_until_the_send_lane_moves(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, max_in_flight_per_number=2)
    number(client, "+15550000301")
    seq = sequence(client)
    enrolled = [enroll(client, seq, contact(client)) for _ in range(3)]
    release(runtime, clock)
    waiting = [e for e in enrolled if not enrollment(client, e)["messages"]]
    assert len(waiting) == 1
    assert enrollment(client, waiting[0])["enrollment"]["waiting_reason"] == "in_flight"
    for claimed in ok(client.post("/v1/send-lane/claim", json={"limit": 10}))["items"]:
        ok(
            client.post(
                "/v1/events", json={"type": "message.status", "message_id": claimed["id"], "status": "SENT"}
            )
        )
    clock.advance(timedelta(seconds=15))
    release(runtime, clock)
    assert len(enrollment(client, waiting[0])["messages"]) == 1


def test_a_used_up_monthly_quota_defers_30_minutes_and_a_new_month_frees_it(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, monthly_message_quota=2)
    clock.set(datetime(2030, 1, 31, 23, 0, tzinfo=UTC))
    seq = sequence(client)
    enrolled = [enroll(client, seq, contact(client)) for _ in range(3)]
    release(runtime, clock)
    waiting = [e for e in enrolled if not enrollment(client, e)["messages"]]
    assert len(waiting) == 1
    read = enrollment(client, waiting[0])["enrollment"]
    assert (read["waiting_reason"], read["next_run_at"]) == ("quota", at(clock.now() + timedelta(minutes=30)))
    clock.set(datetime(2030, 2, 1, 0, 0, tzinfo=UTC))
    release(runtime, clock)
    assert len(enrollment(client, waiting[0])["messages"]) == 1


def test_a_send_lane_backlog_over_its_limit_defers_30_minutes(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, max_send_lane_backlog=1)
    seq = sequence(client)
    enrolled = [enroll(client, seq, contact(client)) for _ in range(3)]
    release(runtime, clock)
    reasons = sorted(str(enrollment(client, e)["enrollment"]["waiting_reason"]) for e in enrolled)
    assert reasons == ["None", "None", "backlog"]


def test_the_per_contact_cap_defers_until_the_oldest_follow_up_is_24_hours_old(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    put_settings(client, max_per_contact_24h=1)
    person = contact(client)
    first = enroll(client, sequence(client), person)
    release(runtime, clock)
    sent_at = clock.now()
    clock.advance(timedelta(hours=3))
    second = enroll(client, sequence(client), person)
    release(runtime, clock)
    read = enrollment(client, second)["enrollment"]
    assert (read["waiting_reason"], read["next_run_at"]) == ("contact_cap", at(sent_at + timedelta(hours=24)))
    assert len(enrollment(client, first)["messages"]) == 1
    clock.set(sent_at + timedelta(hours=24))
    release(runtime, clock)
    assert len(enrollment(client, second)["messages"]) == 1


def test_a_template_step_without_a_name_or_a_bad_window_is_a_422_naming_the_field(
    client: TestClient[Any],
) -> None:
    bad_template = {"kind": "message", "text": "x", "whatsapp_template": {"name": "", "language": "en"}}
    created = ok(
        client.post("/v1/sequences", json={"name": "s", "definition": {"steps": [bad_template]}}), 201
    )
    response = client.post(f"/v1/sequences/{created['id']}/publish")
    assert (response.status_code, response.json()["errors"][0]["field"]) == (
        422,
        "definition.steps.0.whatsapp_template.name",
    )
    bad_window = {"kind": "message", "text": "x", "send_window": {"start": "10:00", "end": "10:00"}}
    created = ok(client.post("/v1/sequences", json={"name": "s", "definition": {"steps": [bad_window]}}), 201)
    response = client.post(f"/v1/sequences/{created['id']}/publish")
    assert (response.status_code, response.json()["errors"][0]["field"]) == (
        422,
        "definition.steps.0.send_window",
    )
