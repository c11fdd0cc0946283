"""A delayed rule's delay (seed 002): counted in business hours (in the project's time zone), the
bad input around it and the delay, and the ``runs_after`` badge.

Rules created through the API, events caused through ``POST /v1/events``, time driven by the ManualClock,
triggers processed with ``process_triggers`` (which records the pending executions of delayed rules) and
due executions fired with ``sweep``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from tests.conftest import Project
from tests.delayed_rule_helpers import (
    PENDING,
    assert_problem,
    at,
    change_status,
    due,
    fire,
    labels_of,
    new_conversation,
    of_conversation,
    patch_rule,
    set_time,
    stuck_in_pending_rule,
    the_one,
)
from tests.helpers import rows
from tests.rule_helpers import add_label, create_rule, process
from tests.rule_trigger_helpers import put_settings

NINE_TO_FIVE = {"start": "09:00", "end": "17:00", "days": ["mon", "tue", "wed", "thu", "fri"]}


# --- business hours ----------------------------------------------------------------------------------------


def test_a_delay_in_business_hours_counts_open_time_only(client: TestClient[Any], runtime: Runtime) -> None:
    [(timezone,)] = rows(runtime.pool, "SELECT timezone FROM projects")
    assert timezone == "UTC"
    put_settings(client, business_hours=NINE_TO_FIVE)
    four = stuck_in_pending_rule(client, 240)
    patch_rule(client, four, delay_in_business_hours=True)
    three = create_rule(
        client,
        "conversation.updated",
        [add_label("three-hours")],
        PENDING,
        execution_delay_minutes=180,
        delay_in_business_hours=True,
    )

    def due_of(rule: str, conversation: str) -> datetime:
        [execution] = [e for e in of_conversation(client, conversation) if e["rule_id"] == rule]
        return due(execution)

    # Friday 16:00: one hour on Friday, then Monday from 09:00 (the "Monday 11:00" for 4 hours does
    # not add up: 1 h + 3 h is Monday 12:00; 3 business hours are Monday 11:00)
    set_time(runtime, "2030-01-04T16:00")
    friday = new_conversation(client)
    change_status(client, friday, "pending")
    process(runtime)
    assert due_of(four, friday) == at("2030-01-07T12:00")
    assert due_of(three, friday) == at("2030-01-07T11:00")

    # inside business hours it is plain time; on a Saturday it starts on Monday morning
    set_time(runtime, "2030-01-05T10:00")
    saturday = new_conversation(client)
    change_status(client, saturday, "pending")
    process(runtime)
    assert due_of(four, saturday) == at("2030-01-07T13:00")
    set_time(runtime, "2030-01-07T09:30")
    monday = new_conversation(client)
    change_status(client, monday, "pending")
    process(runtime)
    assert due_of(four, monday) == at("2030-01-07T13:30")

    set_time(runtime, "2030-01-07T11:00")
    fire(runtime)
    assert labels_of(client, friday) == ["three-hours"]
    set_time(runtime, "2030-01-07T12:00")
    fire(runtime)
    assert labels_of(client, friday) == ["stale-pending", "three-hours"]


def test_business_hours_are_counted_in_the_projects_time_zone(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    put_settings(client, timezone="America/Sao_Paulo", business_hours=NINE_TO_FIVE)  # UTC-3 all year
    rule = create_rule(
        client,
        "conversation.updated",
        [add_label("stale-pending")],
        PENDING,
        execution_delay_minutes=240,
        delay_in_business_hours=True,
    )
    set_time(runtime, "2030-01-04T19:00")  # Friday 16:00 in São Paulo
    conversation = new_conversation(client)
    change_status(client, conversation, "pending")
    process(runtime)
    assert due(the_one(client, rule)) == at("2030-01-07T15:00")  # Monday 12:00 in São Paulo


def test_bad_delays_are_refused_naming_the_field(client: TestClient[Any], runtime: Runtime) -> None:
    body = {"name": "x", "event": "conversation.updated", "actions": [add_label("x")]}

    # business hours asked for, the project has none
    response = client.post(
        "/v1/rules", json=body | {"execution_delay_minutes": 240, "delay_in_business_hours": True}
    )
    assert "business_hours" in assert_problem(response, 422, "delay_in_business_hours")["detail"]
    rule = create_rule(client, "conversation.updated", [add_label("x")], execution_delay_minutes=240)
    response = client.patch(f"/v1/rules/{rule}", json={"delay_in_business_hours": True})
    assert_problem(response, 422, "delay_in_business_hours")

    # business hours without a delay to count in them
    put_settings(client, business_hours=NINE_TO_FIVE)
    response = client.post("/v1/rules", json=body | {"delay_in_business_hours": True})
    problem = assert_problem(response, 422, "delay_in_business_hours")
    assert "execution_delay_minutes" in problem["detail"]
    response = client.patch(
        f"/v1/rules/{rule}", json={"delay_in_business_hours": True, "execution_delay_minutes": None}
    )
    assert_problem(response, 422, "delay_in_business_hours")

    # out of bounds, or not a whole number of minutes
    for bad in (0, -5, 43_201, 1.5, "4h", True):
        response = client.post("/v1/rules", json=body | {"execution_delay_minutes": bad})
        assert_problem(response, (400, 422), "execution_delay_minutes")
        response = client.patch(f"/v1/rules/{rule}", json={"execution_delay_minutes": bad})
        assert_problem(response, (400, 422), "execution_delay_minutes")
    read = client.get(f"/v1/rules/{rule}").json()
    assert (read["execution_delay_minutes"], read["delay_in_business_hours"]) == (240, False)
    [(count,)] = rows(runtime.pool, "SELECT count(*) FROM rules")
    assert count == 1
    # the bounds themselves are fine
    for fine in (1, 43_200):
        assert patch_rule(client, rule, execution_delay_minutes=fine)["execution_delay_minutes"] == fine


# --- the runs_after badge ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "badge"),
    [(None, "immediately"), (45, "45m"), (240, "4h"), (1560, "1d 2h"), (1440, "1d"), (61, "1h 1m")],
)
def test_runs_after_shows_the_delay(client: TestClient[Any], delay: int | None, badge: str) -> None:
    rule = create_rule(client, "conversation.updated", [add_label("x")], execution_delay_minutes=delay)
    assert client.get(f"/v1/rules/{rule}").json()["runs_after"] == badge
    [listed] = client.get("/v1/rules").json()["items"]
    assert listed["runs_after"] == badge
