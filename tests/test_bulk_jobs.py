"""A bulk enrollment job's life over the REST API: Idempotency-Key, cancel, the ``bulk_job.progress``
/ ``bulk_job.completed`` events, input validation (a clear 4xx naming the field, and no job row), listing,
other projects' jobs (404), and processing that survives what goes wrong in the middle.

A job is created through ``POST /v1/bulk-enrollments`` and moved on here, in the test's thread, by calling
the triggers service's ``bulk.process_chunk`` (on the runtime's manual clock) until it has nothing left to
do.
"""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.errors import InvalidInput
from libs.common.core.runtime import Runtime
from libs.common.rules import bulk
from libs.common.rules.bulk import BulkCreate
from tests.bulk_helpers import (
    BULK,
    TAGGED_VIP,
    as_project,
    bulk_events,
    chunk,
    create,
    drain,
    enrolled_contacts,
    fresh_phone,
    job_count,
    outcomes,
    read,
)
from tests.conftest import Project
from tests.helpers import rows, wait_until
from tests.test_api_sequences import assert_problem, count, message_step, new_contact, new_sequence, published

# --- Idempotency-Key


def test_a_retry_with_the_same_idempotency_key_returns_the_same_job_and_creates_nothing(
    client: TestClient[Any], pool: ConnectionPool
) -> None:
    sequence_id = published(client)
    contacts = [new_contact(client) for _ in range(3)]
    first = create(client, key="import-42", sequence_id=sequence_id, contact_ids=contacts)
    items = count(pool, "SELECT count(*) FROM followup_bulk_job_items")

    # When the same request is retried with the same key
    again = create(client, 200, key="import-42", sequence_id=sequence_id, contact_ids=contacts)
    # Then it answers 200 with the same job, and nothing more was created
    assert again == first
    assert job_count(pool) == 1
    assert count(pool, "SELECT count(*) FROM followup_bulk_job_items") == items == 3

    # When another key is given, another job is created
    other = create(client, key="import-43", sequence_id=sequence_id, contact_ids=contacts)
    assert other["id"] != first["id"]
    # and without a key, each request makes a job
    create(client, sequence_id=sequence_id, contact_ids=contacts)
    create(client, sequence_id=sequence_id, contact_ids=contacts)
    assert job_count(pool) == 4


def test_the_idempotency_key_is_per_project(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    mine = create(client, key="same", sequence_id=published(client), contact_ids=[new_contact(client)])
    with as_project(client, other_project) as other:
        theirs = create(other, key="same", sequence_id=published(other), contact_ids=[new_contact(other)])
    assert theirs["id"] != mine["id"]


@pytest.mark.parametrize("key", ["", "k" * 201, "a\x00b"])
def test_a_bad_idempotency_key_is_refused(
    client: TestClient[Any], pool: ConnectionPool, project: Project, clock: ManualClock, key: str
) -> None:
    sequence_id = published(client)
    contact = new_contact(client)
    if "\x00" in key:  # a header cannot carry NUL: the domain function is what refuses it
        data = BulkCreate(sequence_id=uuid.UUID(sequence_id), contact_ids=[uuid.UUID(contact)])
        with pool.connection() as conn, pytest.raises(InvalidInput) as refused:
            bulk.create_job(conn, project.id, data, idempotency_key=key, now=clock.now())
        assert refused.value.field == "Idempotency-Key"
    else:
        response = client.post(
            BULK,
            json={"sequence_id": sequence_id, "contact_ids": [contact]},
            headers={"Idempotency-Key": key},
        )
        assert_problem(response, 422, "Idempotency-Key")
    assert job_count(pool) == 0


def test_a_concurrent_retry_with_the_same_idempotency_key_returns_the_job_the_first_request_created(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, project: Project, clock: ManualClock
) -> None:
    # Given a first request still creating its job (its transaction open: a long list takes a while)
    sequence_id = published(client)
    contacts = [new_contact(client) for _ in range(2)]
    data = BulkCreate(sequence_id=uuid.UUID(sequence_id), contact_ids=[uuid.UUID(c) for c in contacts])
    responses: list[Any] = []
    with pool.connection() as conn:
        first, created = bulk.create_job(conn, project.id, data, idempotency_key="once", now=clock.now())
        assert created
        # When the client, tired of waiting, retries with the same key
        retry = threading.Thread(
            target=lambda: responses.append(
                client.post(
                    BULK,
                    json={"sequence_id": sequence_id, "contact_ids": contacts},
                    headers={"Idempotency-Key": "once"},
                )
            )
        )

        def retry_waits_or_answered() -> bool:
            waiting = count(
                pool,
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            return bool(waiting) or not retry.is_alive()

        retry.start()
        wait_until(retry_waits_or_answered, timeout=30, what="the retry waiting for the first request")
    retry.join(30)

    # Then the retry answers with the job the first request created (not an error), and there is one job
    [response] = responses
    assert response.status_code == 200, response.text
    assert response.json()["id"] == str(first.id)
    assert job_count(pool) == 1


# --- cancel


def test_cancel_stops_the_job_at_its_next_chunk(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, clock: ManualClock
) -> None:
    # Given a job of 6 contacts, one chunk of 2 processed
    sequence_id = published(client)
    contacts = [new_contact(client) for _ in range(6)]
    job = create(client, sequence_id=sequence_id, contact_ids=contacts)
    assert chunk(runtime, 2) == 2

    # When it is cancelled
    clock.advance(timedelta(seconds=5))
    response = client.post(f"{BULK}/{job['id']}/cancel")
    assert response.status_code == 200, response.text
    # Then it says so, and carries on until its next chunk
    assert (response.json()["status"], response.json()["cancel_requested"]) == ("running", True)

    # When the next chunk comes up
    clock.advance(timedelta(seconds=5))
    assert chunk(runtime, 2) == 0
    # Then the job is cancelled there: no further contact enrolled, finished now
    done = read(client, job["id"])
    assert (done["status"], done["processed"], done["enrolled"]) == ("cancelled", 2, 2)
    assert datetime.fromisoformat(done["finished_at"]) == clock.now()
    assert set(enrolled_contacts(pool, sequence_id)) == set(contacts[:2])
    assert drain(runtime, 2) == 0
    assert set(enrolled_contacts(pool, sequence_id)) == set(contacts[:2])
    # the items not reached have no outcome
    assert [o for *_, o, _ in outcomes(pool, job["id"])] == ["enrolled"] * 2 + [None] * 4
    # and its completed event says cancelled, once
    completed = [data for type_, data in bulk_events(pool, job["id"]) if type_ == "bulk_job.completed"]
    assert [(e["status"], e["processed"], e["enrolled"]) for e in completed] == [("cancelled", 2, 2)]

    # When it is cancelled again, it stays as it is
    again = client.post(f"{BULK}/{job['id']}/cancel")
    assert again.status_code == 200 and again.json() == done


def test_a_queued_job_cancelled_enrolls_nobody(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    sequence_id = published(client)
    job = create(client, sequence_id=sequence_id, contact_ids=[new_contact(client) for _ in range(3)])
    assert client.post(f"{BULK}/{job['id']}/cancel").status_code == 200
    assert drain(runtime) == 0
    done = read(client, job["id"])
    assert (done["status"], done["processed"], done["enrolled"]) == ("cancelled", 0, 0)
    assert enrolled_contacts(pool, sequence_id) == {}


def test_cancelling_a_completed_job_leaves_it_completed(client: TestClient[Any], runtime: Runtime) -> None:
    sequence_id = published(client)
    job = create(client, sequence_id=sequence_id, contact_ids=[new_contact(client)])
    drain(runtime)
    done = read(client, job["id"])
    assert done["status"] == "completed"
    response = client.post(f"{BULK}/{job['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json() == done
    assert read(client, job["id"]) == done
    assert done["cancel_requested"] is False


# --- events


def test_progress_events_at_most_once_a_second_and_one_completed_event_with_the_counts(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, clock: ManualClock
) -> None:
    # Given a job of 6 contacts (one of no contact) processed a contact at a time
    sequence_id = published(client)
    contacts = [new_contact(client) for _ in range(5)]
    unknown = fresh_phone()
    job = create(client, sequence_id=sequence_id, contact_ids=contacts, phones=[unknown])

    def events() -> list[tuple[str, dict[str, Any]]]:
        return bulk_events(pool, job["id"])

    # When three chunks are processed at the same instant
    for _ in range(3):
        assert chunk(runtime, 1) == 1
    # Then one progress event was written, after the first
    assert events() == [
        (
            "bulk_job.progress",
            {"job_id": job["id"], "processed": 1, "total": 6, "enrolled": 1, "skipped": {}},
        )
    ]

    # When less than a second has passed: still none
    clock.advance(timedelta(milliseconds=999))
    assert chunk(runtime, 1) == 1
    assert len(events()) == 1

    # When a second has passed since the last progress event: another
    clock.advance(timedelta(milliseconds=1))
    assert chunk(runtime, 1) == 1
    assert events()[1:] == [
        (
            "bulk_job.progress",
            {"job_id": job["id"], "processed": 5, "total": 6, "enrolled": 5, "skipped": {}},
        )
    ]

    # When the job completes (within the second of the last progress event)
    drain(runtime, 1)
    # Then it is one completed event with the counts, and no progress event
    assert events()[2:] == [
        (
            "bulk_job.completed",
            {
                "job_id": job["id"],
                "status": "completed",
                "processed": 6,
                "total": 6,
                "enrolled": 5,
                "skipped": {"unknown_contact": 1},
            },
        )
    ]
    [(occurred_at,)] = rows(
        pool,
        "SELECT occurred_at FROM outbox WHERE type = 'bulk_job.completed' AND aggregate_id = %s",
        job["id"],
    )
    assert occurred_at == clock.now()
    # and nothing more afterwards
    clock.advance(timedelta(seconds=10))
    assert drain(runtime, 1) == 0
    assert len(events()) == 3


def test_each_job_has_its_own_progress_pace(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    # Given two jobs processed at the same instant: each gets its first progress event
    sequence_id = published(client)
    jobs = [
        create(client, sequence_id=sequence_id, contact_ids=[new_contact(client) for _ in range(3)])
        for _ in range(2)
    ]
    drain(runtime, 1)
    for job in jobs:
        assert [t for t, _ in bulk_events(pool, job["id"])] == ["bulk_job.progress", "bulk_job.completed"]


# --- bad input


def _sequence_in(status: str, client: TestClient[Any]) -> str:
    if status == "draft":
        return new_sequence(client, message_step())
    sequence_id = published(client)
    if status != "active":
        action = {"paused": "pause", "archived": "archive"}[status]
        assert client.post(f"/v1/sequences/{sequence_id}/{action}").status_code == 200
    return sequence_id


@pytest.mark.parametrize(
    ("case", "status", "field"),
    [
        ("empty list", 422, "contact_ids"),
        ("empty lists", 422, "contact_ids"),
        ("a list and a segment", 422, "segment"),
        ("neither", 422, "segment"),
        ("draft sequence", 422, "sequence_id"),
        ("paused sequence", 422, "sequence_id"),
        ("archived sequence", 422, "sequence_id"),
        ("unknown sequence", 404, "sequence_id"),
        ("anchor_at and anchor_attribute", 422, "anchor_attribute"),
        ("anchor_attribute not custom", 422, "anchor_attribute"),
        ("anchor_attribute without key", 422, "anchor_attribute"),
        ("anchor_attribute bare key", 422, "anchor_attribute"),
        ("anchor_at without offset", 422, "anchor_at"),
        ("NUL in a variable", 422, "variables.name"),
        ("NUL deep in a variable", 422, "variables.items.1"),
        ("NUL in a variable's key", 422, "variables"),
        ("a contact id that is no id", 400, "contact_ids.0"),
        ("an unknown field", 400, "contact_id"),
    ],
)
def test_bad_input_is_a_clear_4xx_naming_the_field_and_creates_no_job(
    client: TestClient[Any], pool: ConnectionPool, case: str, status: int, field: str
) -> None:
    contact = new_contact(client)
    sequence_id = published(client)
    body: dict[str, Any] = {"sequence_id": sequence_id, "contact_ids": [contact]}
    if case == "empty list":
        body["contact_ids"] = []
    elif case == "empty lists":
        body |= {"contact_ids": [], "phones": []}
    elif case == "a list and a segment":
        body["segment"] = TAGGED_VIP
    elif case == "neither":
        del body["contact_ids"]
    elif case.endswith(" sequence") and case != "unknown sequence":
        body["sequence_id"] = _sequence_in(case.split()[0], client)
    elif case == "unknown sequence":
        body["sequence_id"] = str(uuid.uuid4())
    elif case == "anchor_at and anchor_attribute":
        body |= {"anchor_at": "2030-01-01T00:00:00Z", "anchor_attribute": "contact.attributes.due"}
    elif case == "anchor_attribute not custom":
        body["anchor_attribute"] = "contact.name"
    elif case == "anchor_attribute without key":
        body["anchor_attribute"] = "contact.attributes."
    elif case == "anchor_attribute bare key":
        body["anchor_attribute"] = "due"
    elif case == "anchor_at without offset":
        body["anchor_at"] = "2030-01-01T00:00:00"
    elif case == "NUL in a variable":
        body["variables"] = {"name": "An\x00a"}
    elif case == "NUL deep in a variable":
        body["variables"] = {"items": ["ok", "b\x00d"]}
    elif case == "NUL in a variable's key":
        body["variables"] = {"na\x00me": "Ana"}
    elif case == "a contact id that is no id":
        body["contact_ids"] = ["not-a-uuid"]
    elif case == "an unknown field":
        body["contact_id"] = contact
    response = client.post(BULK, json=body)
    assert_problem(response, status, field)
    assert job_count(pool) == 0


@pytest.mark.parametrize(
    "anchor_attribute",
    ["contact.attributes.a\x00b", "contact.attributes." + "k" * 65],
)
def test_an_anchor_attribute_no_condition_could_name_is_refused(
    client: TestClient[Any], pool: ConnectionPool, anchor_attribute: str
) -> None:
    """The key of contact.attributes.<key> is as a condition's (1 to 64 characters, no NUL): a key that
    cannot be stored, or that no contact attribute can have, is a 422, not a server error."""
    response = client.post(
        BULK,
        json={
            "sequence_id": published(client),
            "contact_ids": [new_contact(client)],
            "anchor_attribute": anchor_attribute,
        },
    )
    assert_problem(response, 422, "anchor_attribute")
    assert job_count(pool) == 0


def test_a_sequence_of_another_project_is_404_naming_sequence_id(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, other_project: Project
) -> None:
    with as_project(client, other_project) as other:
        theirs = published(other)
    response = client.post(BULK, json={"sequence_id": theirs, "contact_ids": [new_contact(client)]})
    assert_problem(response, 404, "sequence_id")
    assert job_count(pool) == 0


def test_a_job_lists_at_most_100000_contacts(client: TestClient[Any], pool: ConnectionPool) -> None:
    sequence_id = published(client)
    contact = new_contact(client)

    def post(ids: int, phones: int) -> Any:
        # the JSON built as text: 100,000 items through json.dumps and the test client's encoder is slow
        items = ",".join([f'"{contact}"'] * ids)
        numbers = ",".join(f'"+4950{i:07d}"' for i in range(phones))
        body = f'{{"sequence_id":"{sequence_id}","contact_ids":[{items}],"phones":[{numbers}]}}'
        return client.post(BULK, content=body, headers={"Content-Type": "application/json"})

    # 100,001 contacts: ids alone, or ids and phones together, are refused
    assert_problem(post(100_001, 0), 422, "contact_ids")
    assert_problem(post(50_001, 50_000), 422, "contact_ids")
    assert job_count(pool) == 0
    # 100,000 are taken
    response = post(60_000, 40_000)
    assert response.status_code == 202, response.text
    assert response.json()["total"] == 100_000
    assert count(pool, "SELECT count(*) FROM followup_bulk_job_items") == 100_000


# --- listing, other projects


def test_jobs_are_listed_a_page_at_a_time_oldest_first(
    client: TestClient[Any], runtime: Runtime, other_project: Project, clock: ManualClock
) -> None:
    sequence_id = published(client)
    contact = new_contact(client)
    created = []
    for _ in range(5):
        created.append(create(client, sequence_id=sequence_id, contact_ids=[contact])["id"])
        clock.advance(timedelta(seconds=1))
    with as_project(client, other_project) as other:
        create(other, sequence_id=published(other), contact_ids=[new_contact(other)])

    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"after": after} if after else {})
        response = client.get(BULK, params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["items"]) <= 2
        seen += [item["id"] for item in body["items"]]
        pages += 1
        after = body["next"]
        if after is None:
            break
    assert seen == created and pages == 3
    # the items are the jobs as GET shows them
    assert client.get(BULK, params={"limit": 1}).json()["items"] == [read(client, created[0])]


def test_another_projects_job_is_404_everywhere(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, other_project: Project
) -> None:
    job = create(client, sequence_id=published(client), contact_ids=[new_contact(client)])
    with as_project(client, other_project) as other:
        assert_problem(other.get(f"{BULK}/{job['id']}"), 404, "job_id")
        assert_problem(other.post(f"{BULK}/{job['id']}/cancel"), 404, "job_id")
        assert_problem(other.get(f"{BULK}/{job['id']}/skipped"), 404, "job_id")
        assert other.get(BULK).json() == {"items": [], "next": None}
    # and their cancel did nothing
    assert read(client, job["id"])["cancel_requested"] is False
    # an unknown job is 404 too
    for response in (client.get(f"{BULK}/{uuid.uuid4()}"), client.post(f"{BULK}/{uuid.uuid4()}/cancel")):
        assert_problem(response, 404, "job_id")


# --- robustness of processing


def test_a_contact_whose_anchor_cannot_be_scheduled_is_skipped_and_the_jobs_go_on(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, other_project: Project
) -> None:
    """A contact's data must not wedge a job: an anchor so late that the step's due time overflows is that
    contact's outcome, the rest of the job (and the jobs queued behind it) go on."""
    # Given a sequence whose step is an hour after the anchor, and a contact anchored at the end of time
    sequence_id = published(client, message_step("See you", anchor_offset_seconds=3600))
    late = new_contact(client, attributes={"due": "9999-12-31T23:30:00+00:00"})
    fine = new_contact(client, attributes={"due": "2030-06-01T10:00:00+00:00"})
    job = create(
        client, sequence_id=sequence_id, contact_ids=[late, fine], anchor_attribute="contact.attributes.due"
    )
    # and another project's job queued behind it
    with as_project(client, other_project) as other:
        behind = create(other, sequence_id=published(other), contact_ids=[new_contact(other)])

    # When the jobs are processed
    drain(runtime)

    # Then the late contact is skipped, the other enrolled, and the job behind completed
    done = read(client, job["id"])
    assert (done["status"], done["processed"], done["enrolled"]) == ("completed", 2, 1)
    assert sum(done["skipped"].values()) == 1
    assert set(enrolled_contacts(pool, sequence_id)) == {fine}
    [(status,)] = rows(pool, "SELECT status FROM followup_bulk_jobs WHERE id = %s", behind["id"])
    assert status == "completed"


@pytest.mark.parametrize("first", ["a multiple of the chunk", "cancelled", "an empty segment"])
def test_process_chunk_returns_0_only_when_there_is_nothing_left_to_do(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, clock: ManualClock, first: str
) -> None:
    """``process_chunk`` returns 0 for "nothing to do" (the bulk loop then sleeps): the pass that completes
    or cancels a job must not say so while another job waits."""
    # Given a first job that ends on a pass handling no contact, and a second job queued behind it
    sequence_id = published(client)
    if first == "an empty segment":
        job = create(client, sequence_id=sequence_id, segment=TAGGED_VIP)
    else:
        job = create(client, sequence_id=sequence_id, contact_ids=[new_contact(client) for _ in range(2)])
    if first == "cancelled":
        assert client.post(f"{BULK}/{job['id']}/cancel").status_code == 200
    clock.advance(timedelta(seconds=1))
    behind = create(client, sequence_id=sequence_id, contact_ids=[new_contact(client)])

    # When process_chunk is called until it returns 0, as the bulk loop does before it sleeps
    calls = 0
    while chunk(runtime, 2) and calls < 100:
        calls += 1

    # Then both jobs are finished
    assert read(client, job["id"])["status"] in ("completed", "cancelled")
    assert read(client, behind["id"])["status"] == "completed"


def test_jobs_are_processed_oldest_first_one_chunk_at_a_time(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, clock: ManualClock
) -> None:
    sequence_id = published(client)
    first = create(client, sequence_id=sequence_id, contact_ids=[new_contact(client) for _ in range(3)])
    clock.advance(timedelta(seconds=1))
    second = create(client, sequence_id=sequence_id, contact_ids=[new_contact(client) for _ in range(2)])
    assert chunk(runtime, 2) == 2
    assert (read(client, first["id"])["processed"], read(client, second["id"])["processed"]) == (2, 0)
    assert drain(runtime, 2) == 3
    assert [read(client, j["id"])["status"] for j in (first, second)] == ["completed", "completed"]


# --- turns across projects


def test_jobs_take_turns_a_chunk_at_a_time_across_projects(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    """A's two jobs were created before B's one: B's first chunk comes second, not after all of A's."""
    clock = runtime.clock
    assert isinstance(clock, ManualClock)
    sequence_id = published(client)
    first = create(client, sequence_id=sequence_id, contact_ids=[new_contact(client) for _ in range(4)])
    clock.advance(timedelta(seconds=1))
    second = create(client, sequence_id=sequence_id, contact_ids=[new_contact(client) for _ in range(4)])
    clock.advance(timedelta(seconds=1))
    with as_project(client, other_project) as other:
        theirs = create(
            other, sequence_id=published(other), contact_ids=[new_contact(other) for _ in range(4)]
        )
    jobs = {first["id"]: "A1", second["id"]: "A2", theirs["id"]: "B"}

    moved = []
    for _ in range(6):
        clock.advance(timedelta(seconds=1))
        before = dict(rows(runtime.pool, "SELECT id::text, processed FROM followup_bulk_jobs"))
        assert chunk(runtime, 2) == 2
        after = dict(rows(runtime.pool, "SELECT id::text, processed FROM followup_bulk_jobs"))
        moved += [jobs[job_id] for job_id in after if after[job_id] != before[job_id]]

    # the project whose jobs moved least recently goes next; within it, its job that moved least recently
    assert moved == ["A1", "B", "A2", "B", "A1", "A2"]
