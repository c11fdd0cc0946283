"""Campaigns over the REST API: a campaign put with ``PUT /v1/campaigns/{id}`` (its sequence) and read
back, then each recipient released through ``POST /v1/events`` (``campaign.recipient_released``) enrolled
once per campaign and recipient.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from tests.bulk_helpers import as_project, enrolled_contacts, enrollments_total, opt_out, post_event
from tests.conftest import Project
from tests.test_api_sequences import assert_problem, count, message_step, new_contact, published

# --- campaigns


def released(campaign_id: str, recipient_id: str, contact_id: str) -> dict[str, Any]:
    return {
        "type": "campaign.recipient_released",
        "campaign_id": campaign_id,
        "recipient_id": recipient_id,
        "contact_id": contact_id,
    }


def test_a_campaign_is_put_with_its_sequence_and_read_back(
    client: TestClient[Any], runtime: Runtime, other_project: Project, clock: ManualClock
) -> None:
    campaign_id = str(uuid.uuid4())
    sequence_id = published(client)
    response = client.put(
        f"/v1/campaigns/{campaign_id}", json={"sequence_id": sequence_id, "name": " Spring "}
    )
    assert response.status_code == 200, response.text
    campaign = response.json()
    assert (campaign["id"], campaign["sequence_id"], campaign["name"]) == (campaign_id, sequence_id, "Spring")
    assert client.get(f"/v1/campaigns/{campaign_id}").json() == campaign

    # replaced by another PUT
    clock.advance(timedelta(minutes=1))
    other_sequence = published(client)
    replaced = client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": other_sequence}).json()
    assert (replaced["sequence_id"], replaced["name"]) == (other_sequence, None)
    assert (
        replaced["created_at"] == campaign["created_at"] and replaced["updated_at"] != campaign["updated_at"]
    )

    # another project's sequence, or an unknown one, is 404 naming sequence_id
    with as_project(client, other_project) as other:
        theirs = published(other)
        # and they do not see the campaign
        assert_problem(other.get(f"/v1/campaigns/{campaign_id}"), 404, "campaign_id")
    for sequence in (theirs, str(uuid.uuid4())):
        assert_problem(
            client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": sequence}), 404, "sequence_id"
        )
    assert client.get(f"/v1/campaigns/{campaign_id}").json() == replaced
    assert_problem(client.get(f"/v1/campaigns/{uuid.uuid4()}"), 404, "campaign_id")
    # a bad name
    bad = client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": sequence_id, "name": "  "})
    assert_problem(bad, 422, "name")


def test_a_released_recipient_is_enrolled_once_per_campaign_and_recipient(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    campaign_id = str(uuid.uuid4())
    sequence_id = published(client, message_step("No reply? {{vars.campaign_id}}"))
    assert client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": sequence_id}).status_code == 200
    contact = new_contact(client)
    before = {r: enrollments_total("campaign", r) for r in ("enrolled", "deduplicated")}

    # When the recipient is released
    first = post_event(client, released(campaign_id, "r-1", contact))
    # Then it is enrolled in the campaign's sequence
    assert (first["type"], first["status"], first["applied"]) == (
        "campaign.recipient_released",
        "enrolled",
        True,
    )
    assert first["contact_id"] == contact and first["enrollment_id"]
    enrolled = enrolled_contacts(pool, sequence_id, source="campaign")
    assert list(enrolled) == [contact]
    assert enrolled[contact]["variables"] == {"campaign_id": campaign_id}

    # When the same release comes again: deduplicated, the same enrollment
    again = post_event(client, released(campaign_id, "r-1", contact))
    assert (again["status"], again["applied"], again["enrollment_id"]) == (
        "deduplicated",
        False,
        first["enrollment_id"],
    )
    assert count(pool, "SELECT count(*) FROM followup_enrollments") == 1
    after = {r: enrollments_total("campaign", r) - v for r, v in before.items()}
    assert after == {"enrolled": 1, "deduplicated": 1}


def test_a_recipient_id_of_200_characters_is_enrolled(client: TestClient[Any], pool: ConnectionPool) -> None:
    """recipient_id may have up to 200 characters: the dedupe key built from it must not refuse it."""
    campaign_id = str(uuid.uuid4())
    sequence_id = published(client)
    assert client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": sequence_id}).status_code == 200
    contact = new_contact(client)
    response = client.post("/v1/events", json=released(campaign_id, "r" * 200, contact))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "enrolled"
    again = post_event(client, released(campaign_id, "r" * 200, contact))
    assert again["status"] == "deduplicated"
    # 201 characters are refused, naming the field
    assert_problem(
        client.post("/v1/events", json=released(campaign_id, "r" * 201, contact)), 422, "recipient_id"
    )


def test_an_opted_out_recipient_is_a_status_not_an_error(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    campaign_id = str(uuid.uuid4())
    sequence_id = published(client)
    assert client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": sequence_id}).status_code == 200
    contact = new_contact(client)
    opt_out(client, contact)
    before = enrollments_total("campaign", "opted_out")

    result = post_event(client, released(campaign_id, "r-2", contact), 200)

    assert (result["status"], result["applied"], result["enrollment_id"]) == ("opted_out", False, None)
    assert enrollments_total("campaign", "opted_out") - before == 1
    assert count(pool, "SELECT count(*) FROM followup_enrollments") == 0


def test_a_release_of_an_unknown_campaign_is_404_naming_campaign_id(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, other_project: Project
) -> None:
    contact = new_contact(client)
    response = client.post("/v1/events", json=released(str(uuid.uuid4()), "r-3", contact))
    assert_problem(response, 404, "campaign_id")
    # another project's campaign is unknown here too
    campaign_id = str(uuid.uuid4())
    with as_project(client, other_project) as other:
        put = other.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": published(other)})
        assert put.status_code == 200, put.text
    assert_problem(client.post("/v1/events", json=released(campaign_id, "r-3", contact)), 404, "campaign_id")
    assert count(pool, "SELECT count(*) FROM followup_enrollments") == 0


def test_two_campaigns_release_the_same_recipient_id_each_once(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    contact = new_contact(client)
    results = []
    for _ in range(2):
        campaign_id = str(uuid.uuid4())
        assert (
            client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": published(client)}).status_code
            == 200
        )
        results.append(post_event(client, released(campaign_id, "same", contact))["status"])
    assert results == ["enrolled", "enrolled"]
    assert count(pool, "SELECT count(*) FROM followup_enrollments WHERE source = 'campaign'") == 2
