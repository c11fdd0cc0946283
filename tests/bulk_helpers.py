"""What the bulk enrollment tests share: creating a job through ``POST /v1/bulk-enrollments`` and
reading it back, moving it on chunk by chunk on the manual clock, and reading what it left (enrollments,
each contact's outcome, events, counters)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.runtime import Runtime
from libs.common.rules import bulk
from tests.conftest import Project
from tests.helpers import rows
from tests.test_api_sequences import count

BULK = "/v1/bulk-enrollments"


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
    """Each item's (position, contact_id as text, phone, outcome, reason), in order (bulk.item_outcomes)."""
    ((project_id,),) = rows(pool, "SELECT project_id FROM followup_bulk_jobs WHERE id = %s", job_id)
    with pool.connection() as conn:
        items = bulk.item_outcomes(conn, project_id, uuid.UUID(str(job_id)))
    return [(p, str(c) if c is not None else None, phone, o, r) for p, c, phone, o, r in items]


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


@contextmanager
def as_project(client: TestClient[Any], project: Project) -> Iterator[TestClient[Any]]:
    """The test's client, authenticated as ``project`` for the block."""
    saved = client.headers["Authorization"]
    client.headers.update(project.headers)
    try:
        yield client
    finally:
        client.headers["Authorization"] = saved


_phones = iter(range(10**6))


def fresh_phone() -> str:
    """A phone no other helper hands out (new_contact's are +1415555....)."""
    return f"+4930{next(_phones):07d}"


TAGGED_VIP = {"all": [{"attribute": "contact.tags", "operator": "contains", "value": "vip"}]}
