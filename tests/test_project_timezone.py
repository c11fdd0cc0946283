"""The project's time zone in ``/v1/settings`` and on the settings page: UTC by default, an IANA name
checked, kept by a ``PUT`` that leaves it out; the zone the docs fall back to (send windows and business
hours are tested in test_sending_constraints and test_delayed_rule_delays, through this API)."""

from __future__ import annotations

from datetime import UTC, datetime

from services.release.release import release_one
from tests.dashboard_helpers import field_error
from tests.factories import make_contact
from tests.helpers import rows
from tests.test_api_sequences import assert_problem, message_step, published


def test_the_time_zone_is_utc_by_default_and_set_through_the_settings(client, pool, project) -> None:
    assert client.get("/v1/settings").json()["timezone"] == "UTC"
    response = client.put("/v1/settings", json={"timezone": "Europe/Lisbon", "retention_days": 30})
    assert response.status_code == 200, response.text
    assert response.json()["timezone"] == "Europe/Lisbon"
    assert rows(pool, "SELECT timezone FROM projects WHERE id = %s", project.id) == [("Europe/Lisbon",)]
    # a PUT without it keeps it (every other field takes its default)
    kept = client.put("/v1/settings", json={"send_delay_ms": 5}).json()
    assert (kept["timezone"], kept["retention_days"]) == ("Europe/Lisbon", 90)
    assert client.get("/v1/settings").json()["timezone"] == "Europe/Lisbon"


def test_a_time_zone_that_is_not_an_iana_name_is_refused(client, pool, project) -> None:
    zone_error = {"field": "timezone", "message": "timezone must be an IANA time zone such as Europe/Lisbon"}
    for bad in ("Mars/Olympus", "Europe", "UTC+1"):
        problem = assert_problem(client.put("/v1/settings", json={"timezone": bad}), 422, "timezone")
        assert problem["errors"] == [zone_error]
    # with a bad window too: both at once
    body = {"timezone": "Mars/Olympus", "send_window": {"start": "9am", "end": "17:00"}}
    problem = assert_problem(client.put("/v1/settings", json=body), 422)
    assert [e["field"] for e in problem["errors"]] == ["timezone", "send_window.start"]
    assert_problem(client.put("/v1/settings", json={"timezone": ""}), 422, "timezone")
    assert rows(pool, "SELECT timezone FROM projects WHERE id = %s", project.id) == [("UTC",)]


def test_anchor_times_of_a_contact_without_a_zone_are_in_the_projects(
    client, runtime, clock, project
) -> None:
    client.put("/v1/settings", json={"timezone": "Asia/Tokyo"})
    sequence_id = published(client, message_step(text="See you at {{anchor.time}}"))
    contact = make_contact(runtime.pool, project.id, phone="+14155550177")
    anchor = datetime(2030, 1, 7, 3, 0, tzinfo=UTC)  # 12:00 in Tokyo
    response = client.post(
        "/v1/enrollments",
        json={"sequence_id": sequence_id, "contact_id": str(contact), "anchor_at": anchor.isoformat()},
    )
    assert response.status_code == 201, response.text
    release_one(runtime.pool, clock, runtime.settings.followup)
    assert rows(runtime.pool, "SELECT body FROM messages WHERE project_id = %s", project.id) == [
        ("See you at 12:00",)
    ]


def test_the_settings_page_shows_and_sets_the_time_zone(signed_in) -> None:
    app, token = signed_in
    assert 'value="UTC"' in app.get("/app/settings").text
    data = {"_csrf": token, "consent_mode": "off", "service_window": "off", "timezone": "Nowhere/City"}
    refused = app.post("/app/settings", data=data)
    assert refused.status_code == 422
    assert field_error(refused.text, "timezone") == "timezone must be an IANA time zone such as Europe/Lisbon"
    saved = app.post("/app/settings", data=data | {"timezone": "America/Sao_Paulo"}, follow_redirects=False)
    assert saved.status_code == 303, saved.text
    assert 'value="America/Sao_Paulo"' in app.get("/app/settings").text
