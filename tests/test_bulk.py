"""The contacts a bulk enrollment job is made of, over the REST API: a list of ids and phones copied in,
or a segment frozen at creation; each contact's outcome (enrolled, or skipped with the refusal's reason),
the counts read back through ``GET``, the enrollments themselves (source ``bulk``, the job's variables and
anchor), and the skipped CSV.

A job is created through ``POST /v1/bulk-enrollments`` and moved on here, in the test's thread, by calling
the triggers service's ``bulk.process_chunk`` (on the runtime's manual clock) until it has nothing left to
do.
"""

from __future__ import annotations

import csv
import io
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from tests.bulk_helpers import (
    BULK,
    TAGGED_VIP,
    as_project,
    bulk_events,
    chunk,
    create,
    drain,
    enrolled_contacts,
    enrollments_total,
    fresh_phone,
    job_count,
    opt_out,
    outcomes,
    post_event,
    read,
)
from tests.conftest import Project
from tests.helpers import rows
from tests.test_api_sequences import assert_problem, count, enroll, message_step, new_contact, published


def erase(client: TestClient[Any], contact_id: str) -> None:
    post_event(client, {"type": "contact.erased", "contact_id": contact_id})


def iso(moment: datetime) -> str:
    return moment.isoformat()


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
        ["5", "", f"'{unknown_phone}", "unknown_contact"],
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
    assert lines[1] == f"1,,'{phones[0]},unknown_contact"
    assert lines[-1] == f"3000,,'{phones[-1]},unknown_contact"
