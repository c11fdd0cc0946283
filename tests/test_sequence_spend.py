"""A sequence's monthly spend in its statistics: its template messages the provider took, by category (the
step's, else the sequence's) and UTC month, times the project's price of the category."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from tests.test_sending_constraints import contact, enroll, enrollment, ok, put_settings, release, sequence

PRICES = {"marketing": 0.0625, "utility": 0.004, "service": 0.0, "currency": "EUR"}


def report(client: TestClient[Any], message_id: str, status: str) -> None:
    body = {"type": "message.status", "message_id": message_id, "status": status}
    ok(client.post("/v1/events", json=body))


def test_template_messages_the_provider_took_cost_their_categorys_price_each_month(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    # Given prices, the service window enforced (contacts who never wrote get the templates), and a
    # sequence whose first step is a utility template and second a marketing one, a month later
    put_settings(client, message_prices=PRICES, service_window="enforced")
    template = {"name": "order_update", "language": "en"}
    seq = sequence(
        client,
        {"kind": "message", "text": "Order", "whatsapp_template": template, "category": "utility"},
        {"kind": "message", "text": "Promo", "whatsapp_template": template, "delay_seconds": 31 * 86400},
    )
    clock.set(datetime(2030, 1, 20, 12, tzinfo=UTC))
    enrolled = [enroll(client, seq, contact(client)) for _ in range(3)]
    release(runtime, clock)

    # When the provider takes two of the first step's messages and fails the third, then the second step's
    first = [enrollment(client, e)["messages"][0]["id"] for e in enrolled]
    report(client, first[0], "SENT")
    report(client, first[1], "DELIVERED")
    report(client, first[2], "FAILED")
    clock.advance(timedelta(days=31, seconds=1))
    release(runtime, clock)
    for e in enrolled[:2]:
        report(client, enrollment(client, e)["messages"][-1]["id"], "READ")

    # Then January has two utility messages, February two marketing ones, each at its price
    spend = ok(client.get(f"/v1/sequences/{seq}/statistics"))["spend"]
    assert spend == [
        {"month": "2030-01", "messages_by_category": {"utility": 2}, "amount": 0.008, "currency": "EUR"},
        {"month": "2030-02", "messages_by_category": {"marketing": 2}, "amount": 0.125, "currency": "EUR"},
    ]
    # And without prices there is no spend to show
    put_settings(client, service_window="enforced")
    assert ok(client.get(f"/v1/sequences/{seq}/statistics"))["spend"] == []


@pytest.mark.parametrize(
    ("prices", "field"),
    [
        ({"marketing": -1}, "message_prices.marketing"),
        ({"utility": 1000}, "message_prices.utility"),
        ({"currency": "euro"}, "message_prices.currency"),
        ({"premium": 1}, "message_prices.premium"),
    ],
)
def test_bad_prices_are_a_422_naming_the_field(
    client: TestClient[Any], prices: dict[str, Any], field: str
) -> None:
    put_settings(client, message_prices=PRICES)
    response = client.put("/v1/settings", json={"message_prices": prices})
    assert response.status_code in (400, 422), response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]
    assert ok(client.get("/v1/settings"))["message_prices"] == PRICES
