"""The dashboard's project-wide pages over HTTP: the project's settings (their form and its
validation) and the results per sequence and step."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from libs.common.followups.definition import MessageStep
from libs.common.followups.statistics import daily_activity, sequence_counts
from services.release.release import release_one
from tests.dashboard_helpers import api, field_error
from tests.factories import make_contact, make_enrollment, make_sequence

# --- settings -----------------------------------------------------------------------------------------------


def settings_form(token: str, **fields: Any) -> dict[str, Any]:
    return {
        "_csrf": token,
        "consent_mode": "off",
        "service_window": "off",
        "send_delay_ms": "0",
        "retention_days": "90",
    } | fields


def test_settings_change_the_send_window_and_the_caps(signed_in, project) -> None:
    client, token = signed_in
    response = client.post(
        "/app/settings",
        data=settings_form(
            token,
            **{
                "send_window.enabled": "on",
                "send_window.start": "09:00",
                "send_window.end": "17:30",
                "send_window.days": ["mon", "fri"],
                "consent_mode": "required",
                "max_per_contact_24h": "2",
                "send_delay_ms": "1500",
                "ai_monthly_token_budget": "100000",
            },
        ),
        follow_redirects=False,
    )
    assert response.status_code == 303
    stored = api(client, project, "GET", "/v1/settings")
    assert stored["send_window"] == {"start": "09:00", "end": "17:30", "days": ["mon", "fri"]}
    assert stored["consent_mode"] == "required" and stored["max_per_contact_24h"] == 2
    assert stored["send_delay_ms"] == 1500 and stored["ai_monthly_token_budget"] == 100000
    page = client.get("/app/settings").text
    assert 'name="send_window.start" value="09:00"' in page and 'value="fri" checked' in page
    assert "gpt-4o-mini" in page and "Tokens used this month: 0 of 100000" in page


@pytest.mark.parametrize(
    ("fields", "name", "message"),
    [
        (
            {
                "send_window.enabled": "on",
                "send_window.start": "25:00",
                "send_window.end": "10:00",
                "send_window.days": "mon",
            },
            "send_window.start",
            "24-hour time",
        ),
        (
            {"send_window.enabled": "on", "send_window.start": "09:00", "send_window.end": "10:00"},
            "send_window.days",
            "at least one day",
        ),
        ({"send_delay_ms": "99999999"}, "send_delay_ms", "from 0 to 3600000"),
        ({"max_per_contact_24h": "two"}, "max_per_contact_24h", "whole number"),
        ({"retention_days": "0"}, "retention_days", "from 1 to 3650"),
        (
            {
                "business_hours.enabled": "on",
                "business_hours.start": "9",
                "business_hours.end": "17:00",
                "business_hours.days": "mon",
            },
            "business_hours.start",
            "24-hour time",
        ),
    ],
)
def test_settings_errors_are_shown_next_to_their_field(signed_in, project, fields, name, message) -> None:
    client, token = signed_in
    response = client.post("/app/settings", data=settings_form(token, **fields))
    assert response.status_code == 422
    assert message in field_error(response.text, name)
    assert api(client, project, "GET", "/v1/settings")["send_window"] is None


def test_settings_list_the_numbers_and_their_status(signed_in, project) -> None:
    client, _ = signed_in
    api(
        client,
        project,
        "POST",
        "/v1/numbers",
        json={"phone": "+14155550300", "name": "Sales", "is_default": True},
    )
    api(client, project, "POST", "/v1/numbers", json={"phone": "+14155550301", "status": "disconnected"})
    page = client.get("/app/settings").text
    assert "+14155550300" in page and 'status-connected">connected' in page
    assert 'status-disconnected">disconnected' in page


# --- results ------------------------------------------------------------------------------------------------


def test_results_per_sequence_and_step_with_svg_charts(signed_in, project, runtime, clock) -> None:
    client, _token = signed_in
    sequence_id = make_sequence(
        runtime.pool,
        project.id,
        MessageStep(text="Hi"),
        MessageStep(text="Hi {{vars.missing}}", delay_seconds=0),
    )
    for _n in range(3):
        contact = make_contact(runtime.pool, project.id)
        make_enrollment(runtime.pool, clock, project.id, sequence_id, contact)
    empty = client.get(f"/app/sequences/{sequence_id}/results").text
    assert 'Enrolled</div><div class="value">3' in empty
    for _ in range(3):
        release_one(runtime.pool, clock, runtime.settings.followup)
    clock.advance(timedelta(seconds=6))  # each contact's spacing before its second step
    for _ in range(3):
        release_one(runtime.pool, clock, runtime.settings.followup)
    page = client.get(f"/app/sequences/{sequence_id}/results").text
    assert '<svg class="chart" role="img"' in page and page.count("<svg") == 2
    assert "Step 1: 3 messages (3 queued)" in page  # the funnel's description
    assert "A placeholder has no value: vars.missing: 3" in page  # the skip reason's label
    assert 'Completed</div><div class="value">3' in page
    today = f'<td>{clock.now().date()}</td><td class="num">3</td><td class="num">3</td><td class="num">3</td>'
    assert today in page


def test_sequence_counts_and_daily_activity(project, runtime, clock) -> None:
    sequence_id = make_sequence(runtime.pool, project.id)
    other = make_sequence(runtime.pool, project.id)
    for _ in range(2):
        make_enrollment(runtime.pool, clock, project.id, sequence_id, make_contact(runtime.pool, project.id))
    clock.advance(timedelta(days=1))
    release_one(runtime.pool, clock, runtime.settings.followup)
    with runtime.pool.connection() as conn:
        counts = sequence_counts(conn, project.id, [sequence_id, other])
        days = daily_activity(conn, project.id, sequence_id, days=3, now=clock.now())
    assert counts[sequence_id].enrolled == 2 and counts[sequence_id].completed == 1
    assert counts[sequence_id].active == 1 and counts[other].enrolled == 0
    assert [d.day for d in days][-1] == clock.now().date() and len(days) == 3
    assert [(d.enrolled, d.queued, d.completed) for d in days] == [(0, 0, 0), (2, 0, 0), (0, 1, 1)]
