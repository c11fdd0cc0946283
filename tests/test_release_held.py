"""A step held back says why, with the values its check compared (the release path's decision trace): a
deferred enrollment's ``waiting_values`` (the send window opening there and then, the contact cap n/n
until when), a skipped step run's ``reason_values`` (consent, an ``only_if``), read through
``GET /v1/enrollments/{id}`` and shown in the dashboard's enrollment timeline and contact card; cleared once
the enrollment moves on.

Through the API and the dashboard, the release as it runs, time on the ManualClock.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from litestar.testing import TestClient

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from services.release.release import release_batch
from tests.conftest import Project, sign_in
from tests.dashboard_helpers import api

#: A Monday in July: Lisbon is UTC+1.
JULY = datetime(2030, 7, 1, tzinfo=UTC)
#: A Monday in January: Lisbon is UTC+0.
JANUARY = datetime(2030, 1, 7, tzinfo=UTC)


def setup(client: TestClient[Any], project: Project, *, steps: int = 1, **settings: Any) -> str:
    """The project's settings, and a published sequence of ``steps`` message steps a day apart."""
    api(client, project, "PUT", "/v1/settings", json=settings)
    definition = {
        "steps": [{"kind": "message", "text": "Hello"}]
        + [{"kind": "message", "text": "Again", "delay_seconds": 86400}] * (steps - 1)
    }
    created = api(client, project, "POST", "/v1/sequences", json={"name": "s", "definition": definition})
    api(client, project, "POST", f"/v1/sequences/{created['id']}/publish")
    sequence_id: str = created["id"]
    return sequence_id


def enroll(client: TestClient[Any], project: Project, sequence_id: str, contact_id: str) -> str:
    body = {"sequence_id": sequence_id, "contact_id": contact_id}
    enrollment_id: str = api(client, project, "POST", "/v1/enrollments", json=body)["id"]
    return enrollment_id


def contact(client: TestClient[Any], project: Project, **fields: Any) -> str:
    phone = f"+1555{uuid.uuid4().int % 10**7:07d}"
    contact_id: str = api(client, project, "POST", "/v1/contacts", json={"phone": phone, **fields})["id"]
    return contact_id


def release(runtime: Runtime, clock: ManualClock) -> None:
    release_batch(runtime.pool, clock, runtime.settings.followup)


def test_outside_the_send_window_the_enrollment_says_when_it_opens_there(
    signed_in: Any, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    client, _ = signed_in
    # Given a 09:00-17:00 window and a contact in Lisbon, enrolled at 06:00 UTC (07:00 in Lisbon, July)
    sequence_id = setup(client, project, steps=2, send_window={"start": "09:00", "end": "17:00"})
    clock.set(JULY.replace(hour=6))
    person = contact(client, project, timezone="Europe/Lisbon")
    enrolled = enroll(client, project, sequence_id, person)

    # When the release runs
    release(runtime, clock)

    # Then the enrollment waits for the window, and says when it opens, there
    read = api(client, project, "GET", f"/v1/enrollments/{enrolled}")["enrollment"]
    assert read["waiting_reason"] == "send_window"
    assert read["waiting_values"] == {
        "opens_at": "2030-07-01T08:00:00Z",
        "local": "09:00",
        "day": "mon",
        "timezone": "Europe/Lisbon",
        "window": {
            "start": "09:00",
            "end": "17:00",
            "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
        },
    }
    # and the dashboard's timeline and the contact card say it in words
    sign_in(client, project)  # a session of this time
    said = "send window opens at 09:00 Europe/Lisbon (mon)"
    assert said in client.get(f"/app/enrollments/{enrolled}/timeline").text
    assert said in client.get(f"/app/contacts/{person}").text

    # When it opens, the step goes, and the enrollment, on to its next step, waits for nothing any more
    clock.set(JULY.replace(hour=8))
    release(runtime, clock)
    read = api(client, project, "GET", f"/v1/enrollments/{enrolled}")["enrollment"]
    assert (read["step_index"], read["waiting_reason"], read["waiting_values"]) == (1, None, None)


def test_the_contact_cap_says_how_many_went_and_until_when(
    signed_in: Any, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    client, _ = signed_in
    # Given a cap of 3 a day, and a contact in Lisbon sent three follow-ups from 14:05
    person_fields = {"timezone": "Europe/Lisbon"}
    first = JANUARY.replace(hour=14, minute=5)
    clock.set(first)
    person = contact(client, project, **person_fields)
    for hours in range(3):
        clock.set(first + timedelta(hours=hours))
        enroll(client, project, setup(client, project, max_per_contact_24h=3), person)
        release(runtime, clock)

    # When a fourth is due at 18:00
    clock.set(JANUARY.replace(hour=18))
    fourth = enroll(client, project, setup(client, project, max_per_contact_24h=3), person)
    release(runtime, clock)

    # Then it waits for the oldest to be 24 hours old: "contact cap 3/3 until 14:05"
    read = api(client, project, "GET", f"/v1/enrollments/{fourth}")["enrollment"]
    assert read["waiting_reason"] == "contact_cap"
    assert read["waiting_values"] == {
        "sent": 3,
        "limit": 3,
        "until": "2030-01-08T14:05:00Z",
        "local": "14:05",
        "timezone": "Europe/Lisbon",
    }
    sign_in(client, project)  # a session of this time
    assert (
        "contact cap 3/3 until 14:05 Europe/Lisbon" in client.get(f"/app/enrollments/{fourth}/timeline").text
    )


def test_a_skipped_step_keeps_the_values_its_check_compared(
    signed_in: Any, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    client, _ = signed_in
    # Given consent required and a contact whose consent is unknown
    sequence_id = setup(client, project, consent_mode="required")
    enrolled = enroll(client, project, sequence_id, contact(client, project))

    # When the release runs, Then the step is skipped, and its run says what consent it found
    release(runtime, clock)
    detail = api(client, project, "GET", f"/v1/enrollments/{enrolled}")
    [run] = detail["step_runs"]
    assert (run["outcome"], run["reason"]) == ("skipped", "no_consent")
    consent = run["reason_values"]["consent"]
    assert run["reason_values"] == {"consent": consent, "consent_mode": "required"} and consent != "granted"
    timeline = client.get(f"/app/enrollments/{enrolled}/timeline").text
    assert f"consent is {consent} and the project requires it" in timeline


def test_a_step_that_goes_keeps_no_values(
    signed_in: Any, project: Project, runtime: Runtime, clock: ManualClock
) -> None:
    client, _ = signed_in
    enrolled = enroll(client, project, setup(client, project), contact(client, project))
    release(runtime, clock)
    [run] = api(client, project, "GET", f"/v1/enrollments/{enrolled}")["step_runs"]
    assert (run["outcome"], run["reason"], run["reason_values"]) == ("queued", None, None)
