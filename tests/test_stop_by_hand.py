"""Stops outside the platform events: by hand and by re-entry; and what the send lane is told."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from services.release.release import release_batch


def _queued_follow_up(
    client: TestClient[Any], runtime: Runtime, reentry: str = "after_finished"
) -> tuple[dict[str, Any], str]:
    contact = client.post("/v1/contacts", json={"phone": "+14155550177", "name": "Ada"}).json()
    sequence = client.post(
        "/v1/sequences",
        json={
            "name": "s",
            "definition": {
                "reentry": reentry,
                "steps": [
                    {"kind": "message", "text": "first"},
                    {"kind": "message", "text": "second", "delay_seconds": 3600},
                ],
            },
        },
    ).json()
    assert client.post(f"/v1/sequences/{sequence['id']}/publish").status_code == 201
    enrollment = client.post(
        "/v1/enrollments", json={"sequence_id": sequence["id"], "contact_id": contact["id"]}
    ).json()
    assert release_batch(runtime.pool, runtime.clock, runtime.settings.followup) == 1
    detail = client.get(f"/v1/enrollments/{enrollment['id']}").json()
    assert [m["status"] for m in detail["messages"]] == ["QUEUED"]
    return enrollment, detail["messages"][0]["id"]


def _failed_events(runtime: Runtime) -> list[dict[str, Any]]:
    with runtime.pool.connection() as conn:
        return [row[0] for row in conn.execute("SELECT data FROM outbox WHERE type = 'message.failed'")]


def test_a_manual_stop_cancels_the_follow_up_still_queued(client: TestClient[Any], runtime: Runtime) -> None:
    enrollment, message_id = _queued_follow_up(client, runtime)
    response = client.post(f"/v1/enrollments/{enrollment['id']}/stop", json={"note": "deal signed"})
    assert response.status_code == 200, response.text
    detail = client.get(f"/v1/enrollments/{enrollment['id']}").json()
    assert detail["enrollment"]["reason"] == "manual"
    assert [m["status"] for m in detail["messages"]] == ["CANCELLED"]
    assert [(e["message_id"], e["reason"], e["stop_reason"]) for e in _failed_events(runtime)] == [
        (message_id, "CANCELLED", "manual")
    ]


def test_a_reentry_that_replaces_an_enrollment_cancels_its_queued_follow_up(
    client: TestClient[Any], runtime: Runtime
) -> None:
    enrollment, message_id = _queued_follow_up(client, runtime, reentry="always")
    again = client.post(
        "/v1/enrollments",
        json={"sequence_id": enrollment["sequence_id"], "contact_id": enrollment["contact_id"]},
    )
    assert again.status_code == 201, again.text
    old = client.get(f"/v1/enrollments/{enrollment['id']}").json()
    assert (old["enrollment"]["status"], old["enrollment"]["reason"]) == ("stopped", "reentered")
    assert [m["status"] for m in old["messages"]] == ["CANCELLED"]
    assert [e["message_id"] for e in _failed_events(runtime)] == [message_id]


def test_the_claimed_event_carries_what_the_send_lane_needs_and_erasure_removes_it(
    client: TestClient[Any], runtime: Runtime
) -> None:
    enrollment, message_id = _queued_follow_up(client, runtime)
    claimed = client.post("/v1/send-lane/claim", json={"limit": 5}).json()["items"]
    assert [m["id"] for m in claimed] == [message_id]
    with runtime.pool.connection() as conn:
        (data,) = conn.execute("SELECT data FROM outbox WHERE type = 'message.claimed'").fetchone()  # type: ignore[misc]
    assert (data["message_id"], data["phone"], data["body"]) == (message_id, "+14155550177", "first")
    erased = client.post(
        "/v1/events", json={"type": "contact.erased", "contact_id": enrollment["contact_id"]}
    )
    assert erased.status_code == 200, erased.text
    with runtime.pool.connection() as conn:
        left = conn.execute("SELECT count(*) FROM outbox WHERE type = 'message.claimed'").fetchone()
        text = conn.execute("SELECT count(*) FROM outbox WHERE data::text LIKE '%%4155550177%%'").fetchone()
    assert left == (0,)
    assert text == (0,)


def test_a_stopped_enrollment_keeps_no_next_run_ahead(client: TestClient[Any], runtime: Runtime) -> None:
    # Given an enrollment whose second step is due in an hour
    enrollment, _ = _queued_follow_up(client, runtime)
    now = runtime.clock.now()
    # When it is stopped by hand
    stopped = client.post(f"/v1/enrollments/{enrollment['id']}/stop").json()
    # Then nothing is due: the API answers no next run, and the row keeps none ahead
    assert (stopped["status"], stopped["next_run_at"]) == ("stopped", None)
    assert client.get(f"/v1/enrollments/{enrollment['id']}").json()["enrollment"]["next_run_at"] is None
    with runtime.pool.connection() as conn:
        row = conn.execute(
            "SELECT next_run_at FROM followup_enrollments WHERE id = %s", (enrollment["id"],)
        ).fetchone()
    assert row is not None and row[0] <= now


def test_a_second_reply_with_nothing_to_stop_names_no_stop_reason(
    client: TestClient[Any], runtime: Runtime
) -> None:
    # Given a follow-up that a first reply stopped
    enrollment, _ = _queued_follow_up(client, runtime)
    contact_id = enrollment["contact_id"]
    event = {"type": "message.inbound", "contact_id": contact_id, "provider_message_id": "first"}
    first = client.post("/v1/events", json=event).json()
    assert (first["stopped_enrollment_ids"], first["stop_reason"]) == ([enrollment["id"]], "replied")
    # When the contact writes again
    second = client.post("/v1/events", json=event | {"provider_message_id": "second"}).json()
    # Then nothing was stopped, and no reason is given
    assert (second["stopped_enrollment_ids"], second["cancelled_message_ids"]) == ([], [])
    assert second["stop_reason"] is None
