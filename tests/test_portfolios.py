"""Business portfolios on the controllable clock: numbers share their portfolio's messaging limit (unique
recipients of business-initiated conversations in a rolling 24 h, by tier), each number an equal share of
it; a follow-up past it is deferred (``messaging_limit``); the tier is a setting or a platform event."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.platform.conversations import create_conversation
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.test_sending_constraints import SETTINGS, ok, rows


def portfolio(client: TestClient[Any], **fields: Any) -> dict[str, Any]:
    return ok(client.post("/v1/portfolios", json={"name": "Acme", **fields}), 201)  # type: ignore[no-any-return]


def number_in(client: TestClient[Any], portfolio_id: str | None) -> str:
    phone = f"+1555{uuid.uuid4().int % 10**7:07d}"
    body = {"phone": phone, "portfolio_id": portfolio_id}
    return ok(client.post("/v1/numbers", json=body), 201)["id"]  # type: ignore[no-any-return]


def enroll_on(runtime: Runtime, project: Project, sequence_id: uuid.UUID, number_id: str, count: int) -> None:
    """``count`` new contacts talking on the number (a conversation the business opened), each enrolled."""
    for _ in range(count):
        contact_id = make_contact(runtime.pool, project.id)
        with runtime.pool.connection() as conn:
            create_conversation(
                conn, project.id, contact_id, now=runtime.clock.now(), number_id=uuid.UUID(number_id)
            )
        make_enrollment(runtime.pool, runtime.clock, project.id, sequence_id, contact_id)


def release_everything(runtime: Runtime, clock: ManualClock) -> None:
    while release_batch(runtime.pool, clock, SETTINGS, limit=500):
        pass


def sent_by_number(runtime: Runtime) -> dict[str, int]:
    sql = "SELECT number_id::text, count(*) FROM messages WHERE direction = 'outbound' GROUP BY 1"
    return {n: c for n, c in rows(runtime.pool, sql)}


def waiting(runtime: Runtime) -> list[tuple[Any, ...]]:
    """(waiting_reason, next_run_at) of the live enrollments, grouped."""
    sql = (
        "SELECT waiting_reason, next_run_at, count(*) FROM followup_enrollments"
        " WHERE status = 'active' GROUP BY 1, 2 ORDER BY 1, 2"
    )
    return rows(runtime.pool, sql)


def test_a_portfolio_of_three_numbers_hits_its_tier_each_number_its_share_then_recovers(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock, project: Project
) -> None:
    # Given a tier-250 portfolio of three numbers, 100 new recipients on each, and a number outside it
    acme = portfolio(client)
    assert (acme["tier"], acme["limit"]) == ("tier_250", 250)
    a, b, c = (number_in(client, acme["id"]) for _ in range(3))
    outside = number_in(client, None)
    seq = make_sequence(runtime.pool, project.id)
    for n in (a, b, c, outside):
        enroll_on(runtime, project, seq, n, 100)
    started = clock.now()

    # When every follow-up is due
    release_everything(runtime, clock)

    # Then the portfolio opens 250 conversations, no number more than its share (84), the number outside it
    # all of its own; the rest wait for the first hour that counted to leave the 24 h
    sent = sent_by_number(runtime)
    assert sent[outside] == 100
    assert sum(sent[n] for n in (a, b, c)) == 250
    assert max(sent[n] for n in (a, b, c)) == 84
    hour = started.replace(minute=0, second=0, microsecond=0)
    assert waiting(runtime) == [("messaging_limit", hour + timedelta(hours=25), 50)]
    assert ok(client.get(f"/v1/portfolios/{acme['id']}"))["number_ids"] == sorted([a, b, c])

    # And a recipient the portfolio already opened a conversation with, or who wrote, is not new
    again = make_sequence(runtime.pool, project.id)
    [(known,)] = rows(
        runtime.pool, "SELECT contact_id FROM messages WHERE number_id = %s LIMIT 1", uuid.UUID(a)
    )
    make_enrollment(runtime.pool, clock, project.id, again, known)
    writer = make_contact(runtime.pool, project.id)
    with runtime.pool.connection() as conn:
        create_conversation(conn, project.id, writer, now=clock.now(), number_id=uuid.UUID(a))
    inbound = {"type": "message.inbound", "contact_id": str(writer), "provider_message_id": "w-1"}
    ok(client.post("/v1/events", json=inbound), 201)
    make_enrollment(runtime.pool, clock, project.id, again, writer)
    clock.advance(timedelta(seconds=10))
    release_everything(runtime, clock)
    assert sent_by_number(runtime)[a] == sent[a] + 2

    # And once the first hour has left the window, the waiting ones go
    clock.set(hour + timedelta(hours=25))
    release_everything(runtime, clock)
    assert sum(sent_by_number(runtime)[n] for n in (a, b, c)) == 300 + 2
    assert waiting(runtime) == []


def test_one_busy_number_cannot_take_the_others_share(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock, project: Project
) -> None:
    acme = portfolio(client)
    busy, quiet, idle = (number_in(client, acme["id"]) for _ in range(3))
    seq = make_sequence(runtime.pool, project.id)
    enroll_on(runtime, project, seq, busy, 200)
    release_everything(runtime, clock)
    assert sent_by_number(runtime)[busy] == 84  # its share of 250, though the portfolio has room
    enroll_on(runtime, project, seq, quiet, 30)
    clock.advance(timedelta(minutes=5))
    release_everything(runtime, clock)
    assert sent_by_number(runtime)[quiet] == 30
    assert idle not in sent_by_number(runtime)


def test_the_tier_is_a_setting_or_a_platform_event(client: TestClient[Any], other_project: Project) -> None:
    acme = portfolio(client, tier="tier_1k")
    assert acme["limit"] == 1000
    member = number_in(client, acme["id"])
    assert ok(client.get(f"/v1/numbers/{member}"))["portfolio_id"] == acme["id"]
    changed = ok(
        client.post(
            "/v1/events",
            json={
                "type": "number.quality_changed",
                "number_id": member,
                "tier": "tier_10k",
                "quality": "GREEN",
            },
        )
    )
    assert changed["applied"] is True
    assert (
        ok(client.get(f"/v1/portfolios/{acme['id']}"))["tier"],
        ok(client.get(f"/v1/portfolios/{acme['id']}"))["limit"],
    ) == ("tier_10k", 10_000)
    ok(
        client.post(
            "/v1/events",
            json={"type": "portfolio.tier_changed", "portfolio_id": acme["id"], "tier": "tier_unlimited"},
        )
    )
    read = ok(client.get(f"/v1/portfolios/{acme['id']}"))
    assert (read["tier"], read["limit"]) == ("tier_unlimited", None)
    assert ok(client.patch(f"/v1/portfolios/{acme['id']}", json={"tier": "tier_100k"}))["limit"] == 100_000
    assert [p["id"] for p in ok(client.get("/v1/portfolios"))["items"]] == [acme["id"]]
    lonely = number_in(client, None)
    assert (
        ok(
            client.post(
                "/v1/events", json={"type": "number.quality_changed", "number_id": lonely, "tier": "tier_1k"}
            )
        )["applied"]
        is False
    )
    ok(client.patch(f"/v1/numbers/{lonely}", json={"portfolio_id": acme["id"]}))
    assert len(ok(client.get(f"/v1/portfolios/{acme['id']}"))["number_ids"]) == 2


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    [
        ("post", "/v1/portfolios", {"name": "x", "tier": "tier_2"}, 422, "tier"),
        ("post", "/v1/portfolios", {"tier": "tier_1k"}, 400, "name"),
        (
            "post",
            "/v1/numbers",
            {"phone": "+15550009999", "portfolio_id": "00000000-0000-4000-8000-000000000001"},
            404,
            "portfolio_id",
        ),
        ("get", "/v1/portfolios/00000000-0000-4000-8000-000000000002", None, 404, "portfolio_id"),
    ],
)
def test_bad_portfolio_input_is_a_4xx_naming_the_field_and_stores_nothing(
    client: TestClient[Any], method: str, path: str, body: Any, status: int, field: str
) -> None:
    response = getattr(client, method)(path, **({"json": body} if body is not None else {}))
    assert response.status_code == status, response.text
    problem = response.json()
    fields = [e["field"] for e in problem.get("errors", [])] or [problem.get("field")]
    assert field in fields, problem
    assert ok(client.get("/v1/portfolios"))["items"] == []
    assert ok(client.get("/v1/numbers"))["items"] == []


def test_another_projects_portfolio_is_not_found(client: TestClient[Any], other_project: Project) -> None:
    acme = portfolio(client)
    theirs = other_project.headers
    assert client.get(f"/v1/portfolios/{acme['id']}", headers=theirs).status_code == 404
    response = client.post(
        "/v1/numbers", json={"phone": "+15550001234", "portfolio_id": acme["id"]}, headers=theirs
    )
    assert response.status_code == 404, response.text
    assert client.get("/v1/portfolios", headers=theirs).json()["items"] == []
