"""Bulk enrollments and campaigns over the REST API.

A job is created through ``POST /v1/bulk-enrollments`` and moved on here, in the test's thread, by calling
the triggers service's ``bulk.process_chunk`` (on the runtime's manual clock) until it has nothing left to
do. What is checked: the contacts a job is made of (a list of ids and phones copied in, or a segment frozen
at creation), each contact's outcome (enrolled, or skipped with the refusal's reason), the counts read back
through ``GET``, the enrollments themselves (source ``bulk``, the job's variables and anchor), the
``bulk_job.progress`` / ``bulk_job.completed`` events, Idempotency-Key, cancel, the skipped CSV, input
validation (a clear 4xx naming the field, and no job row), listing, other projects' jobs (404), and
campaigns (``PUT /v1/campaigns/{id}``, then ``campaign.recipient_released`` through ``POST /v1/events``).
"""

from __future__ import annotations

import csv
import io
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.errors import InvalidInput
from libs.common.core.runtime import Runtime
from libs.common.rules import bulk
from libs.common.rules.bulk import BulkCreate
from tests.conftest import Project
from tests.helpers import rows, wait_until
from tests.test_api_sequences import (
    assert_problem,
    count,
    enroll,
    message_step,
    new_contact,
    new_sequence,
    published,
)

BULK = "/v1/bulk-enrollments"

# --- helpers


def create(
    client: TestClient[Any], expected: int = 202, *, key: str | None = None, **body: Any
) -> dict[str, Any]:
    """POST a job; asserts the status and returns the job."""
    headers = {"Idempotency-Key": key} if key is not None else {}
    response = client.post(BULK, json=body, headers=headers)
    assert response.status_code == expected, response.text
    job: dict[str, Any] = response.json()
    return job


def read(client: TestClient[Any], job_id: str) -> dict[str, Any]:
    response = client.get(f"{BULK}/{job_id}")
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    return job


def chunk(runtime: Runtime, size: int = bulk.CHUNK) -> int:
    return bulk.process_chunk(runtime.pool, runtime.clock, chunk=size)


def unfinished(pool: ConnectionPool) -> int:
    return count(pool, "SELECT count(*) FROM followup_bulk_jobs WHERE status IN ('queued', 'running')")


def drain(runtime: Runtime, size: int = bulk.CHUNK) -> int:
    """Process chunks until every job is finished; returns how many contacts were handled.

    Until ``process_chunk`` returns 0 *and* no job is left: it returns 0 too for the pass that completes or
    cancels a job without handling a contact (see
    ``test_process_chunk_returns_0_only_when_there_is_nothing_left_to_do``)."""
    handled = 0
    for _ in range(10_000):
        done = chunk(runtime, size)
        handled += done
        if not done and not unfinished(runtime.pool):
            return handled
    raise AssertionError("the jobs never ran out of work")


def enrollments_total(source: str, result: str) -> float:
    value = REGISTRY.get_sample_value(
        "whatstig_followup_enrollments_total", {"source": source, "result": result}
    )
    return value or 0.0


def job_count(pool: ConnectionPool) -> int:
    return count(pool, "SELECT count(*) FROM followup_bulk_jobs")


def enrolled_contacts(
    pool: ConnectionPool, sequence_id: str, source: str = "bulk"
) -> dict[str, dict[str, Any]]:
    """The sequence's enrollments by contact id (as text), with their source, variables and anchor."""
    found = rows(
        pool,
        "SELECT contact_id, source, variables, anchor_at FROM followup_enrollments"
        " WHERE sequence_id = %s ORDER BY enrolled_at, id",
        sequence_id,
    )
    by_contact: dict[str, dict[str, Any]] = {}
    for contact_id, source_, variables, anchor_at in found:
        assert str(contact_id) not in by_contact, f"{contact_id} enrolled twice"
        by_contact[str(contact_id)] = {"source": source_, "variables": variables, "anchor_at": anchor_at}
    assert all(e["source"] == source for e in by_contact.values()), by_contact
    return by_contact


def outcomes(pool: ConnectionPool, job_id: str) -> list[tuple[Any, ...]]:
    """Each item's (position, contact_id, phone, outcome, reason), in order."""
    return rows(
        pool,
        "SELECT position, contact_id::text, phone, outcome, reason FROM followup_bulk_job_items"
        " WHERE job_id = %s ORDER BY position",
        job_id,
    )


def bulk_events(pool: ConnectionPool, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    found = rows(
        pool,
        "SELECT type, data FROM outbox WHERE aggregate_type = 'bulk_job' AND aggregate_id = %s ORDER BY id",
        job_id,
    )
    return [(type_, data) for type_, data in found]


def post_event(client: TestClient[Any], event: dict[str, Any], expected: int = 200) -> dict[str, Any]:
    response = client.post("/v1/events", json=event)
    assert response.status_code == expected, response.text
    body: dict[str, Any] = response.json()
    return body


def opt_out(client: TestClient[Any], contact_id: str) -> None:
    post_event(client, {"type": "contact.opted_out", "contact_id": contact_id})


def erase(client: TestClient[Any], contact_id: str) -> None:
    post_event(client, {"type": "contact.erased", "contact_id": contact_id})


@contextmanager
def as_project(client: TestClient[Any], project: Project) -> Iterator[TestClient[Any]]:
    """The test's client, authenticated as ``project`` for the block."""
    saved = client.headers["Authorization"]
    client.headers.update(project.headers)
    try:
        yield client
    finally:
        client.headers["Authorization"] = saved


def iso(moment: datetime) -> str:
    return moment.isoformat()


_phones = iter(range(10**6))


def fresh_phone() -> str:
    """A phone no other helper hands out (new_contact's are +1415555....)."""
    return f"+4930{next(_phones):07d}"


TAGGED_VIP = {"all": [{"attribute": "contact.tags", "operator": "contains", "value": "vip"}]}


# --- a list of contacts


def test_a_list_of_ids_and_phones_is_enrolled_and_its_progress_read_through_get(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, clock: ManualClock
) -> None:
    # Given a published sequence, two contacts listed by id, two by phone (one written loosely)
    sequence_id = published(client, message_step("Hi {{vars.first_name}}", delay_seconds=3600))
    by_id = [new_contact(client), new_contact(client)]
    phones = [fresh_phone(), fresh_phone()]
    by_phone = [new_contact(client, phone=phone) for phone in phones]
    loose = f"{phones[1][:3]} ({phones[1][3:6]}) {phones[1][6:9]}-{phones[1][9:]}"
    # and a phone of no contact, and a phone that is no phone
    unknown, malformed = fresh_phone(), "12345"
    anchor = datetime.fromisoformat("2030-03-01T12:00:00+02:00")
    variables = {"first_name": "Ana", "offer": {"code": "SPRING", "pct": 15}, "tags": ["a", "b"]}
    enrolled_before = enrollments_total("bulk", "enrolled")

    # When the job is created
    job = create(
        client,
        sequence_id=sequence_id,
        contact_ids=by_id,
        phones=[phones[0], loose, unknown, malformed],
        variables=variables,
        anchor_at=iso(anchor),
    )

    # Then it is queued with its contacts counted, nothing done yet
    assert job["status"] == "queued"
    assert (job["total"], job["processed"], job["enrolled"], job["skipped"]) == (6, 0, 0, {})
    assert job["sequence_id"] == sequence_id and job["variables"] == variables
    assert datetime.fromisoformat(job["anchor_at"]) == anchor
    assert job["segment"] is None and job["anchor_attribute"] is None
    assert job["cancel_requested"] is False and job["finished_at"] is None and job["error"] is None
    assert read(client, job["id"]) == job
    assert enrolled_contacts(pool, sequence_id) == {}

    # When one chunk of 4 is processed
    assert chunk(runtime, 4) == 4
    # Then it is running, 4 processed (the two ids and the two phones of contacts)
    running = read(client, job["id"])
    assert running["status"] == "running"
    assert (running["processed"], running["enrolled"], running["skipped"]) == (4, 4, {})
    assert running["finished_at"] is None

    # When the rest is processed
    assert drain(runtime, 4) == 2
    # Then it completed: the unknown phone and the malformed one skipped with their reason
    done = read(client, job["id"])
    assert done["status"] == "completed"
    assert (done["total"], done["processed"], done["enrolled"]) == (6, 6, 4)
    assert done["skipped"] == {"unknown_contact": 1, "invalid_phone": 1}
    assert datetime.fromisoformat(done["finished_at"]) == clock.now()
    assert [(o, r) for *_, o, r in outcomes(pool, job["id"])] == [
        ("enrolled", None),
        ("enrolled", None),
        ("enrolled", None),
        ("enrolled", None),
        ("skipped", "unknown_contact"),
        ("skipped", "invalid_phone"),
    ]
    # and the enrollments exist, source bulk, with the job's variables and anchor
    enrolled = enrolled_contacts(pool, sequence_id)
    assert set(enrolled) == {*by_id, *by_phone}
    for enrollment in enrolled.values():
        assert enrollment["variables"] == variables
        assert enrollment["anchor_at"] == anchor
    assert enrollments_total("bulk", "enrolled") - enrolled_before == 4
    # and each one is due as its sequence says (the first step an hour after enrollment)
    due = rows(
        pool, "SELECT DISTINCT next_run_at FROM followup_enrollments WHERE sequence_id = %s", sequence_id
    )
    assert due == [(clock.now() + timedelta(hours=1),)]


def test_anchor_attribute_anchors_each_contact_on_its_own_time_and_skips_those_without_one(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    # Given a sequence whose step is timed against the anchor (a day before it)
    sequence_id = published(client, message_step("Your renewal", anchor_offset_seconds=-86400))
    # and contacts holding their renewal time in a custom attribute, in various offsets
    times = ["2030-05-01T08:00:00-03:00", "2030-06-15T22:30:00+05:30", "2030-07-01T00:00:00Z"]
    holders = [new_contact(client, attributes={"renewal_at": at}) for at in times]
    # and contacts without it, with a time without offset, with a number, with text that is no time
    missing = [
        new_contact(client),
        new_contact(client, attributes={"renewal_at": "2030-05-01T08:00:00"}),
        new_contact(client, attributes={"renewal_at": 1_900_000_000}),
        new_contact(client, attributes={"renewal_at": "next week"}),
        new_contact(client, attributes={"other": "2030-05-01T08:00:00Z"}),
    ]
    before = enrollments_total("bulk", "enrolled")

    # When a job anchors each enrollment on contact.attributes.renewal_at
    job = create(
        client,
        sequence_id=sequence_id,
        contact_ids=[*holders, *missing],
        anchor_attribute="contact.attributes.renewal_at",
    )
    assert job["anchor_attribute"] == "contact.attributes.renewal_at" and job["anchor_at"] is None
    drain(runtime, 3)

    # Then each holder is enrolled anchored on its own time, the others are skipped: missing_anchor
    done = read(client, job["id"])
    assert (done["status"], done["processed"], done["enrolled"]) == ("completed", 8, 3)
    assert done["skipped"] == {"missing_anchor": 5}
    enrolled = enrolled_contacts(pool, sequence_id)
    assert set(enrolled) == set(holders)
    for contact_id, at in zip(holders, times, strict=True):
        assert enrolled[contact_id]["anchor_at"] == datetime.fromisoformat(at)
    for contact_id, at in zip(holders, times, strict=True):
        [(due,)] = rows(
            pool, "SELECT next_run_at FROM followup_enrollments WHERE contact_id = %s", contact_id
        )
        assert due == datetime.fromisoformat(at) - timedelta(days=1)
    assert enrollments_total("bulk", "enrolled") - before == 3
    skipped = {
        contact: reason
        for _, contact, _, outcome, reason in outcomes(pool, job["id"])
        if outcome == "skipped"
    }
    assert skipped == dict.fromkeys(missing, "missing_anchor")


def test_refusals_are_outcomes_already_enrolled_opted_out_deleted_and_plan_limit(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, project: Project
) -> None:
    # Given a sequence, a contact already enrolled in it, one opted out, one that will be erased
    sequence_id = published(client)
    already, opted, erased, first, second = (new_contact(client) for _ in range(5))
    enroll(client, sequence_id, already)
    opt_out(client, opted)
    # and a plan of 2 live enrollments (one is taken)
    with pool.connection() as conn:
        conn.execute("UPDATE projects SET max_active_enrollments = 2 WHERE id = %s", (project.id,))
    before = {
        result: enrollments_total("bulk", result)
        for result in ("enrolled", "already_enrolled", "opted_out", "plan_limit")
    }

    # When a job lists them all, and the contact to erase is erased after the job was created
    job = create(client, sequence_id=sequence_id, contact_ids=[already, opted, erased, first, second])
    erase(client, erased)
    drain(runtime)

    # Then each refusal is the contact's outcome, not an error of the job
    done = read(client, job["id"])
    assert (done["status"], done["total"], done["processed"], done["enrolled"]) == ("completed", 5, 5, 1)
    assert done["skipped"] == {"already_enrolled": 1, "opted_out": 1, "unknown_contact": 1, "plan_limit": 1}
    assert [(c, o, r) for _, c, _, o, r in outcomes(pool, job["id"])] == [
        (already, "skipped", "already_enrolled"),
        (opted, "skipped", "opted_out"),
        (erased, "skipped", "unknown_contact"),
        (first, "enrolled", None),
        (second, "skipped", "plan_limit"),
    ]
    # and only the one that fitted under the plan was enrolled by the job
    found = rows(
        pool, "SELECT contact_id::text, source FROM followup_enrollments WHERE sequence_id = %s", sequence_id
    )
    assert sorted(found) == sorted([(already, "api"), (first, "bulk")])
    # and the refusals are counted, source bulk
    after = {result: enrollments_total("bulk", result) - value for result, value in before.items()}
    assert after == {"enrolled": 1, "already_enrolled": 1, "opted_out": 1, "plan_limit": 1}


def test_a_contact_listed_twice_is_enrolled_once(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    # Given a contact listed by id and by phone, and twice by id
    sequence_id = published(client)
    phone = fresh_phone()
    contact = new_contact(client, phone=phone)
    job = create(client, sequence_id=sequence_id, contact_ids=[contact, contact], phones=[phone])
    drain(runtime)
    # Then it is enrolled once, the repeats skipped as already enrolled
    done = read(client, job["id"])
    assert (done["processed"], done["enrolled"], done["skipped"]) == (3, 1, {"already_enrolled": 2})
    assert list(enrolled_contacts(pool, sequence_id)) == [contact]


def test_contacts_of_another_project_are_unknown_here(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool, other_project: Project
) -> None:
    # Given a contact of another project, listed by id and by phone
    phone = fresh_phone()
    with as_project(client, other_project) as other:
        theirs = new_contact(other, phone=phone)
    sequence_id = published(client)
    job = create(client, sequence_id=sequence_id, contact_ids=[theirs], phones=[phone])
    drain(runtime)
    # Then neither is enrolled: both are unknown contacts here
    done = read(client, job["id"])
    assert (done["processed"], done["enrolled"], done["skipped"]) == (2, 0, {"unknown_contact": 2})
    assert count(pool, "SELECT count(*) FROM followup_enrollments") == 0


# --- segments


def test_a_segment_is_frozen_when_the_job_is_created(
    client: TestClient[Any],
    runtime: Runtime,
    pool: ConnectionPool,
    other_project: Project,
) -> None:
    # Given contacts tagged vip, one who is not, and a vip of another project
    sequence_id = published(client)
    vips = [new_contact(client, tags=["vip"]), new_contact(client, tags=["vip", "x"])]
    plain = new_contact(client, tags=["x"])
    with as_project(client, other_project) as other:
        foreign = other.post("/v1/contacts", json={"phone": fresh_phone(), "tags": ["vip"]})
        assert foreign.status_code == 201, foreign.text
    # and one erased vip
    erased = new_contact(client, tags=["vip"])
    erase(client, erased)

    # When a job is created for the segment of the vips
    job = create(client, sequence_id=sequence_id, segment=TAGGED_VIP)
    # Then it holds the project's live vips of that moment
    assert (job["status"], job["total"], job["segment"]) == ("queued", 2, TAGGED_VIP)

    # When, before it is processed, the plain contact becomes a vip and a vip stops being one
    assert client.post(f"/v1/contacts/{plain}/tags", json={"tags": ["vip"]}).status_code == 200
    assert client.delete(f"/v1/contacts/{vips[1]}/tags/vip").status_code == 200
    drain(runtime)

    # Then the contacts of the moment it was created are enrolled, and only they
    done = read(client, job["id"])
    assert (done["status"], done["processed"], done["enrolled"], done["skipped"]) == ("completed", 2, 2, {})
    assert set(enrolled_contacts(pool, sequence_id)) == set(vips)


def test_a_segment_that_matches_nobody_makes_an_empty_job_that_completes(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    sequence_id = published(client)
    new_contact(client, tags=["x"])
    job = create(client, sequence_id=sequence_id, segment=TAGGED_VIP)
    assert (job["status"], job["total"]) == ("queued", 0)
    assert chunk(runtime) == 0
    done = read(client, job["id"])
    assert (done["status"], done["total"], done["processed"], done["enrolled"]) == ("completed", 0, 0, 0)
    assert done["finished_at"] is not None
    completed = [data for type_, data in bulk_events(pool, job["id"]) if type_ == "bulk_job.completed"]
    assert [(e["status"], e["total"], e["processed"]) for e in completed] == [("completed", 0, 0)]


def test_a_segment_on_custom_attributes_conversations_and_any_groups(
    client: TestClient[Any], runtime: Runtime, pool: ConnectionPool
) -> None:
    # Given contacts scored, one with an open conversation
    sequence_id = published(client)
    high = new_contact(client, attributes={"score": 90})
    low = new_contact(client, attributes={"score": 10})
    talking = new_contact(client, attributes={"score": 5})
    post_event(client, {"type": "conversation.created", "contact_id": talking}, 201)
    segment = {
        "any": [
            {"attribute": "contact.attributes.score", "operator": "is_greater_than", "value": 80},
            {"attribute": "conversation.status", "operator": "equal_to", "value": "open"},
        ]
    }
    job = create(client, sequence_id=sequence_id, segment=segment)
    assert job["total"] == 2
    drain(runtime)
    assert set(enrolled_contacts(pool, sequence_id)) == {high, talking}
    assert low not in enrolled_contacts(pool, sequence_id)


@pytest.mark.parametrize(
    ("segment", "field"),
    [
        (
            {"all": [{"attribute": "message.content", "operator": "contains", "value": "hi"}]},
            "segment.all.0.attribute",
        ),
        (
            {"any": [{"all": [{"attribute": "message.type", "operator": "equal_to", "value": "incoming"}]}]},
            "segment.any.0.all.0.attribute",
        ),
        (
            {"all": [{"attribute": "changed", "operator": "contains", "value": "contact.name"}]},
            "segment.all.0.attribute",
        ),
        (
            {"all": [{"attribute": "contact.name", "operator": "attribute_changed", "value": {"to": "Ana"}}]},
            "segment.all.0.operator",
        ),
        (
            {"attribute": "contact.tags", "operator": "attribute_changed", "value": {"from": []}},
            "segment.operator",
        ),
        (
            {"all": [{"attribute": "contact.shoe_size", "operator": "equal_to", "value": "9"}]},
            "segment.all.0.attribute",
        ),
        (
            {"all": [{"attribute": "contact.name", "operator": "resembles", "value": "x"}]},
            "segment.all.0.operator",
        ),
        ({"all": "everyone"}, "segment.all"),
        ({}, "segment.attribute"),
    ],
)
def test_a_segment_that_is_not_about_contacts_or_is_invalid_is_refused_naming_its_path(
    client: TestClient[Any], pool: ConnectionPool, segment: dict[str, Any], field: str
) -> None:
    sequence_id = published(client)
    response = client.post(BULK, json={"sequence_id": sequence_id, "segment": segment})
    assert_problem(response, 422, field)
    assert job_count(pool) == 0


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


# --- skipped CSV


def test_the_skipped_contacts_are_a_csv_with_their_reason(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    # Given a job with skipped contacts of every kind, and enrolled ones
    sequence_id = published(client)
    ok = [new_contact(client) for _ in range(2)]
    opted = new_contact(client)
    opt_out(client, opted)
    unknown_id = str(uuid.uuid4())
    unknown_phone = fresh_phone()
    job = create(
        client,
        sequence_id=sequence_id,
        contact_ids=[ok[0], opted, unknown_id, ok[1]],
        phones=[unknown_phone, "not a phone"],
    )
    drain(runtime)

    # When its skipped contacts are read
    response = client.get(f"{BULK}/{job['id']}/skipped")
    # Then they are a CSV: a header, then one row per skipped contact, in order, with its reason
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    assert f"bulk-{job['id']}-skipped.csv" in response.headers["content-disposition"]
    assert list(csv.reader(io.StringIO(response.text))) == [
        ["position", "contact_id", "phone", "reason"],
        ["2", opted, "", "opted_out"],
        ["3", unknown_id, "", "unknown_contact"],
        ["5", "", unknown_phone, "unknown_contact"],
        ["6", "", "not a phone", "invalid_phone"],
    ]

    # and a job that skipped nobody has the header only
    clean = create(client, sequence_id=published(client), contact_ids=ok)
    drain(runtime)
    assert client.get(f"{BULK}/{clean['id']}/skipped").text.splitlines() == [
        "position,contact_id,phone,reason"
    ]

    # and an unknown job, or another project's, is 404
    assert_problem(client.get(f"{BULK}/{uuid.uuid4()}/skipped"), 404, "job_id")
    with as_project(client, other_project) as other:
        assert_problem(other.get(f"{BULK}/{job['id']}/skipped"), 404, "job_id")


def test_a_long_skipped_list_streams_whole(client: TestClient[Any], runtime: Runtime) -> None:
    # Given 3,000 phones of no contact (more than one 64 kB piece of the stream)
    sequence_id = published(client)
    phones = [f"+4940{i:07d}" for i in range(3000)]
    job = create(client, sequence_id=sequence_id, phones=phones)
    drain(runtime)
    lines = client.get(f"{BULK}/{job['id']}/skipped").text.splitlines()
    assert len(lines) == 3001
    assert lines[1] == f"1,,{phones[0]},unknown_contact"
    assert lines[-1] == f"3000,,{phones[-1]},unknown_contact"


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
