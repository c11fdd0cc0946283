"""Goals and exit criteria (issue 28), through the API and the ingress: a goal met mid-delay converts the
enrollment at once (its queued follow-up cancelled, the conversion attributed to the last step sent); a
finished enrollment converts late inside its window, once; an exit ends it exited; an exit that blocks entry
refuses to enroll (one by one and in bulk); a goal wins over an exit; a project without goals sees nothing
change. The live counter stays equal to a count throughout."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import Exit, Goal, MessageStep
from libs.common.followups.goals import CRITERIA
from libs.common.ingress.contact_changes import change_tags
from tests.bulk_helpers import create, drain, outcomes, read
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows
from tests.platform_event_helpers import outbox, post_event
from tests.release_helpers import Metrics
from tests.test_api_sequences import assert_problem, enroll, message_step, new_contact, published, release
from tests.test_live_counters import assert_exact

DAY = 86400
FINISHED = "whatstig_followup_finished_total"
CONVERSIONS = "whatstig_followup_conversions_total"

WON = {
    "name": "won",
    "event": "lead.status_changed",
    "conditions": {"attribute": "lead.status", "operator": "equal_to", "value": "won"},
}
UNSUBSCRIBED = {
    "name": "unsubscribed",
    "event": "contact.tag_added",
    "conditions": {"attribute": "contact.tags", "operator": "contains", "value": "unsubscribed"},
    "blocks_entry": True,
}


def three_steps() -> list[dict[str, Any]]:
    return [
        message_step("first"),
        message_step("second", delay_seconds=DAY),
        message_step("third", delay_seconds=DAY),
    ]


def new_lead(client: TestClient[Any], contact_id: str) -> str:
    lead_id = str(uuid.uuid4())
    post_event(client, {"type": "lead.created", "contact_id": contact_id, "lead_id": lead_id})
    return lead_id


def lead_status(client: TestClient[Any], lead_id: str, status: str) -> dict[str, Any]:
    return post_event(client, {"type": "lead.status_changed", "lead_id": lead_id, "status": status})


def send_all(client: TestClient[Any]) -> list[str]:
    """The send lane claims every queued message and reports it SENT; their ids."""
    claimed = client.post("/v1/send-lane/claim", json={"limit": 100})
    assert claimed.status_code == 200, claimed.text
    ids = [m["id"] for m in claimed.json()["items"]]
    for message_id in ids:
        post_event(client, {"type": "message.status", "message_id": message_id, "status": "SENT"})
    return ids


def enrollment(client: TestClient[Any], enrollment_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/enrollments/{enrollment_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def messages_of(pool: ConnectionPool, enrollment_id: str) -> list[tuple[Any, ...]]:
    return rows(
        pool,
        "SELECT body, status FROM messages WHERE followup_enrollment_id = %s ORDER BY followup_step_index",
        uuid.UUID(enrollment_id),
    )


def test_a_goal_met_mid_delay_converts_at_once_cancels_the_queued_message_and_names_the_last_step_sent(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given an enrollment whose first message was sent and whose second is queued, not sent yet
    sequence_id = published(client, *three_steps(), goals=[WON])
    contact_id = new_contact(client)
    lead_id = new_lead(client, contact_id)
    enrolled = enroll(client, sequence_id, contact_id)
    assert release(runtime) == 1
    send_all(client)
    clock.advance(timedelta(days=1))
    assert release(runtime) == 1
    [(second_id, _)] = rows(
        pool,
        "SELECT id, status FROM messages WHERE followup_enrollment_id = %s AND status = 'QUEUED'",
        uuid.UUID(enrolled["id"]),
    )
    metrics = Metrics((FINISHED, {"status": "converted", "reason": "none"}), (CONVERSIONS, {"late": "false"}))

    # When the lead moves on, but not to won, nothing happens
    assert lead_status(client, lead_id, "qualified")["converted_enrollment_ids"] == []
    assert enrollment(client, enrolled["id"])["enrollment"]["status"] == "active"

    # When the lead is won, mid-delay
    clock.advance(timedelta(hours=3))
    result = lead_status(client, lead_id, "won")

    # Then the enrollment converted at once, its queued message cancelled, attributed to the step sent
    assert result["converted_enrollment_ids"] == [enrolled["id"]]
    assert result["exited_enrollment_ids"] == []
    assert result["cancelled_message_ids"] == [str(second_id)]
    found = enrollment(client, enrolled["id"])["enrollment"]
    assert (found["status"], found["goal"], found["converted_step"], found["exited_by"]) == (
        "converted",
        "won",
        0,
        None,
    )
    assert found["converted_at"] == found["finished_at"]
    assert found["next_run_at"] is None
    assert messages_of(pool, enrolled["id"]) == [("first", "SENT"), ("second", "CANCELLED")]
    [converted] = outbox(pool, "followup.converted")
    assert converted == {
        "enrollment_id": enrolled["id"],
        "sequence_id": sequence_id,
        "contact_id": contact_id,
        "reason": None,
        "goal": "won",
        "converted_step": 0,
        "late": False,
    }
    cancelled = [e for e in outbox(pool, "message.failed") if e["message_id"] == str(second_id)]
    assert [e["stop_reason"] for e in cancelled] == ["converted"]
    assert metrics.delta(FINISHED, status="converted", reason="none") == 1
    assert metrics.delta(CONVERSIONS, late="false") == 1
    assert_exact(pool, project, 0)
    # nothing more goes out
    clock.advance(timedelta(days=3))
    assert release(runtime) == 0

    # the list filters on the new status
    listed = client.get("/v1/enrollments", params={"status": "converted"}).json()["items"]
    assert [e["id"] for e in listed] == [enrolled["id"]]


def test_the_conversion_is_attributed_to_the_last_step_sent(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = published(client, *three_steps(), goals=[WON])
    contact_id = new_contact(client)
    lead_id = new_lead(client, contact_id)
    enrolled = enroll(client, sequence_id, contact_id)
    for _ in range(2):  # the first and second messages sent
        assert release(runtime) == 1
        send_all(client)
        clock.advance(timedelta(days=1))

    assert lead_status(client, lead_id, "won")["converted_enrollment_ids"] == [enrolled["id"]]
    assert enrollment(client, enrolled["id"])["enrollment"]["converted_step"] == 1


def test_a_late_conversion_inside_the_window_counts_once_and_none_outside_it(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given two contacts whose one-step enrollments completed (sent), in a sequence with a 2-day window
    sequence_id = published(client, message_step("only"), goals=[WON], conversion_window_seconds=2 * DAY)
    inside, outside = new_contact(client), new_contact(client)
    leads = {contact: new_lead(client, contact) for contact in (inside, outside)}
    enrolled = {contact: enroll(client, sequence_id, contact)["id"] for contact in (inside, outside)}
    assert release(runtime) == 2
    send_all(client)
    metrics = Metrics((CONVERSIONS, {"late": "true"}), (FINISHED, {"status": "converted", "reason": "none"}))

    # When one lead is won a day later
    clock.advance(timedelta(days=1))
    result = lead_status(client, leads[inside], "won")

    # Then its enrollment converted late: the goal set, its status kept
    assert result["converted_late_enrollment_ids"] == [enrolled[inside]]
    assert result["converted_enrollment_ids"] == []
    found = enrollment(client, enrolled[inside])["enrollment"]
    assert (found["status"], found["goal"], found["converted_step"]) == ("completed", "won", 0)
    converted_at = found["converted_at"]
    [event] = outbox(pool, "followup.converted")
    assert (event["enrollment_id"], event["late"]) == (enrolled[inside], True)

    # When the goal is met again: nothing counts twice
    clock.advance(timedelta(hours=1))
    lead_status(client, leads[inside], "open")
    assert lead_status(client, leads[inside], "won")["converted_late_enrollment_ids"] == []
    assert enrollment(client, enrolled[inside])["enrollment"]["converted_at"] == converted_at
    assert len(outbox(pool, "followup.converted")) == 1

    # When the other lead is won after the window closed: nothing
    clock.advance(timedelta(days=2))
    assert lead_status(client, leads[outside], "won")["converted_late_enrollment_ids"] == []
    assert enrollment(client, enrolled[outside])["enrollment"]["goal"] is None

    assert metrics.delta(CONVERSIONS, late="true") == 1
    assert metrics.delta(FINISHED, status="converted", reason="none") == 0
    assert_exact(pool, project, 0)


def test_an_exit_met_ends_the_enrollment_exited_and_cancels_its_queued_message(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    sequence_id = published(client, *three_steps(), exits=[{**UNSUBSCRIBED, "blocks_entry": False}])
    contact_id, other = new_contact(client), new_contact(client)
    enrolled = enroll(client, sequence_id, contact_id)
    kept = enroll(client, sequence_id, other)
    assert release(runtime) == 2
    metrics = Metrics((FINISHED, {"status": "exited", "reason": "none"}))

    # a tag that is not the exit's changes nothing
    assert client.post(f"/v1/contacts/{contact_id}/tags", json={"tags": ["vip"]}).status_code == 200
    assert enrollment(client, enrolled["id"])["enrollment"]["status"] == "active"

    clock.advance(timedelta(hours=1))
    assert client.post(f"/v1/contacts/{contact_id}/tags", json={"tags": ["unsubscribed"]}).status_code == 200

    found = enrollment(client, enrolled["id"])["enrollment"]
    assert (found["status"], found["exited_by"], found["goal"], found["reason"]) == (
        "exited",
        "unsubscribed",
        None,
        None,
    )
    assert found["finished_at"] is not None
    assert messages_of(pool, enrolled["id"]) == [("first", "CANCELLED")]
    [exited] = outbox(pool, "followup.exited")
    assert (exited["enrollment_id"], exited["exited_by"]) == (enrolled["id"], "unsubscribed")
    assert metrics.delta(FINISHED, status="exited", reason="none") == 1
    assert enrollment(client, kept["id"])["enrollment"]["status"] == "active"
    assert_exact(pool, project, 1)
    listed = client.get("/v1/enrollments", params={"status": "exited"}).json()["items"]
    assert [e["id"] for e in listed] == [enrolled["id"]]


def test_a_goal_wins_over_an_exit_met_by_the_same_event(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    bought = {
        "name": "bought",
        "event": "contact.tag_added",
        "conditions": {"attribute": "event.tags_added", "operator": "contains", "value": "customer"},
    }
    leave = {"name": "leave", "event": "contact.tag_added"}  # any tag added
    sequence_id = published(client, *three_steps(), goals=[bought], exits=[leave])
    contact_id = new_contact(client)
    enrolled = enroll(client, sequence_id, contact_id)

    assert client.post(f"/v1/contacts/{contact_id}/tags", json={"tags": ["customer"]}).status_code == 200

    found = enrollment(client, enrolled["id"])["enrollment"]
    assert (found["status"], found["goal"], found["exited_by"]) == ("converted", "bought", None)
    assert found["converted_step"] is None  # nothing was sent yet
    assert outbox(pool, "followup.exited") == []


def test_an_exit_that_blocks_entry_refuses_to_enroll_one_by_one_and_in_bulk(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    sequence_id = published(client, *three_steps(), exits=[UNSUBSCRIBED])
    blocked, free = new_contact(client, tags=["unsubscribed"]), new_contact(client)

    response = client.post("/v1/enrollments", json={"sequence_id": sequence_id, "contact_id": blocked})
    body = assert_problem(response, 409, "contact_id", "exit_criteria")
    assert "unsubscribed" in body["detail"]

    job = create(client, sequence_id=sequence_id, contact_ids=[blocked, free])
    drain(runtime)
    assert read(client, job["id"])["skipped"] == {"exit_criteria": 1}
    assert [(o, r) for *_, o, r in outcomes(pool, job["id"])] == [
        ("skipped", "exit_criteria:unsubscribed"),
        ("enrolled", None),
    ]
    # once the tag is gone the contact may enroll
    assert client.delete(f"/v1/contacts/{blocked}/tags/unsubscribed").status_code == 200
    enroll(client, sequence_id, blocked)


def test_a_project_without_goals_sees_no_change(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock, project: Project
) -> None:
    sequence_id = published(client, *three_steps())
    contact_id = new_contact(client)
    lead_id = new_lead(client, contact_id)
    enrolled = enroll(client, sequence_id, contact_id)
    assert release(runtime) == 1

    result = lead_status(client, lead_id, "won")
    client.post(f"/v1/contacts/{contact_id}/tags", json={"tags": ["unsubscribed"]})

    assert result["converted_enrollment_ids"] == result["exited_enrollment_ids"] == []
    assert result["cancelled_message_ids"] == []
    assert enrollment(client, enrolled["id"])["enrollment"]["status"] == "active"
    with runtime.pool.connection() as conn:
        assert not CRITERIA.listens(conn, project.id, "lead.status_changed")


def test_the_dashboard_timeline_shows_the_goal_met_and_the_exit(
    signed_in: tuple[TestClient[Any], str], pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    app, _ = signed_in
    bought = Goal(name="bought", event="contact.tag_added", conditions=_tagged("customer"))
    gone = Exit(name="gone", event="contact.tag_added", conditions=_tagged("gone"))
    sequence_id = make_sequence(pool, project.id, MessageStep(text="Hi"), goals=[bought], exits=[gone])
    CRITERIA.invalidate(project.id)  # the publication's after-commit effect: make_sequence runs none
    shown = {}
    for tag in ("customer", "gone"):
        contact_id = make_contact(pool, project.id)
        enrolled = make_enrollment(pool, clock, project.id, sequence_id, contact_id)
        with pool.connection() as conn:
            change_tags(conn, project.id, contact_id, add=[tag], now=clock.now())
        shown[tag] = app.get(f"/app/enrollments/{enrolled.id}/timeline").text

    assert "Goal met: bought" in shown["customer"] and "Converted" in shown["customer"]
    assert "exit: gone" in shown["gone"] and "Exited" in shown["gone"]
    statuses = app.get("/app/enrollments").text
    assert 'value="converted"' in statuses and 'value="exited"' in statuses


def _tagged(tag: str) -> dict[str, Any]:
    return {"attribute": "event.tags_added", "operator": "contains", "value": tag}


def test_a_reply_that_meets_a_goal_converts_the_enrollment_rather_than_stopping_it(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    yes = {
        "name": "said_yes",
        "event": "message.created",
        "conditions": {
            "all": [
                {"attribute": "message.type", "operator": "equal_to", "value": "incoming"},
                {"attribute": "message.content", "operator": "contains", "value": "yes"},
            ]
        },
    }
    sequence_id = published(client, *three_steps(), goals=[yes])
    said_yes, said_no = new_contact(client), new_contact(client)
    enrolled = {contact: enroll(client, sequence_id, contact)["id"] for contact in (said_yes, said_no)}
    assert release(runtime) == 2

    for contact, body in ((said_yes, "Yes please!"), (said_no, "No thanks")):
        reply = {"type": "message.inbound", "contact_id": contact, "provider_message_id": body, "body": body}
        result = post_event(client, reply)
        assert result["converted_enrollment_ids"] == ([enrolled[contact]] if contact == said_yes else [])

    converted = enrollment(client, enrolled[said_yes])["enrollment"]
    assert (converted["status"], converted["goal"], converted["reason"]) == ("converted", "said_yes", None)
    stopped = enrollment(client, enrolled[said_no])["enrollment"]
    assert (stopped["status"], stopped["reason"], stopped["goal"]) == ("stopped", "replied", None)
    assert messages_of(pool, enrolled[said_yes]) == [("first", "CANCELLED")]
