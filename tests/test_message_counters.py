"""The message counters behind the in-flight window and the send-lane backlog: a trigger keeps them equal to
a count over the messages through every path that queues, claims, reports, cancels or deletes messages,
concurrent writers included."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

from psycopg_pool import ConnectionPool

from libs.common.contracts.platform_events import ReportedStatus
from libs.common.core.runtime import Runtime
from libs.common.platform.contacts import erase_contact, lock_contact_for_erasure
from libs.common.platform.messages import OutboundMessage, cancel_queued_messages, queue_contact_message
from libs.common.platform.numbers import NumberCreate, create_number
from libs.common.platform.send_lane import (
    ClaimRequest,
    StatusReport,
    claim_messages,
    report_status,
)
from tests.conftest import Project
from tests.factories import make_contact
from tests.helpers import rows

T0 = datetime(2030, 1, 1, tzinfo=UTC)
REPORTED: list[ReportedStatus] = ["SENT", "FAILED", "SENT", "SENT"]


def counted(pool: ConnectionPool) -> dict[tuple[str, uuid.UUID], int]:
    """What the counters say (the sum of each count's shards), zeros left out."""
    found = rows(
        pool,
        "SELECT kind, owner_id, sum(messages) FROM message_counters GROUP BY 1, 2 HAVING sum(messages) <> 0",
    )
    return {(kind, owner): int(total) for kind, owner, total in found}


def actual(pool: ConnectionPool) -> dict[tuple[str, uuid.UUID], int]:
    """The same counts over the messages themselves."""
    in_flight = rows(
        pool,
        "SELECT number_id, count(*) FROM messages WHERE status IN ('QUEUED', 'PROCESSING')"
        " AND source = 'followup' AND number_id IS NOT NULL GROUP BY 1",
    )
    queued = rows(pool, "SELECT project_id, count(*) FROM messages WHERE status = 'QUEUED' GROUP BY 1")
    return {("number_in_flight", n): c for n, c in in_flight} | {("project_queued", p): c for p, c in queued}


def numbers(pool: ConnectionPool, project_id: uuid.UUID, count: int) -> list[uuid.UUID]:
    with pool.connection() as conn:
        return [
            create_number(conn, project_id, NumberCreate(phone=f"+1555000{i:04d}"), now=T0).id
            for i in range(count)
        ]


def queue(
    pool: ConnectionPool, project_id: uuid.UUID, contact: uuid.UUID, number: uuid.UUID | None, source: str
) -> uuid.UUID:
    with pool.connection() as conn:
        return queue_contact_message(
            conn,
            OutboundMessage(
                project_id=project_id, contact_id=contact, body="hi", source=source, number_id=number
            ),
            now=T0,
        ).message_id


def test_counters_follow_every_status_change(runtime: Runtime, project: Project) -> None:
    pool = runtime.pool
    first, second = numbers(pool, project.id, 2)
    contacts = [make_contact(pool, project.id) for _ in range(3)]
    queued = [
        queue(pool, project.id, contacts[i % 3], (first, second, None)[i % 3], ("followup", "api")[i % 2])
        for i in range(12)
    ]
    assert counted(pool) == actual(pool)
    assert counted(pool)[("project_queued", project.id)] == 12
    assert counted(pool)[("number_in_flight", first)] == 2  # messages 0 and 6: follow-ups on the first

    with pool.connection() as conn:  # QUEUED -> PROCESSING leaves the backlog, not the in-flight window
        claimed = claim_messages(conn, project.id, ClaimRequest(limit=5), now=T0)
    assert len(claimed) == 5
    assert counted(pool) == actual(pool)
    assert counted(pool)[("project_queued", project.id)] == 7

    with pool.connection() as conn:  # PROCESSING -> SENT / FAILED, and a repeat that changes nothing
        reports = [StatusReport(status=s, message_id=m.id) for m, s in zip(claimed, REPORTED, strict=False)]
        for report in reports:
            report_status(conn, project.id, report, now=T0)
        report_status(conn, project.id, StatusReport(status="SENT", message_id=claimed[0].id), now=T0)
    assert counted(pool) == actual(pool)

    with pool.connection() as conn:  # QUEUED -> CANCELLED, PROCESSING left alone
        cancel_queued_messages(conn, project.id, queued, "replied", now=T0)
    assert counted(pool) == actual(pool)
    assert ("project_queued", project.id) not in counted(pool)

    queue(pool, project.id, contacts[0], first, "followup")
    with pool.connection() as conn:  # erasure deletes the contact's messages, queued ones included
        lock_contact_for_erasure(conn, project.id, contacts[0])
        erase_contact(conn, project.id, contacts[0], now=T0)
    assert counted(pool) == actual(pool)


def test_concurrent_writers_keep_counters_exact(runtime: Runtime, project: Project) -> None:
    """Writers that meet on counter rows lock them in one order: none deadlocks, and the counts stay exact."""
    pool = runtime.pool
    number_ids = numbers(pool, project.id, 3)
    contacts = [make_contact(pool, project.id) for _ in range(6)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                barrier.wait()
                work()
            except BaseException as error:  # reported by the test below
                errors.append(error)

        return run

    def queuer(seed: int) -> None:  # each on contacts of its own (a conversation being threaded is busy)
        chooser = random.Random(seed)
        for i in range(40):
            number = chooser.choice([*number_ids, None])
            queue(pool, project.id, contacts[seed * 2 + i % 2], number, chooser.choice(["followup", "api"]))

    def claimer() -> None:
        for _ in range(40):
            with pool.connection() as conn:
                claimed = claim_messages(conn, project.id, ClaimRequest(limit=4), now=T0)
            for message in claimed:  # each report in a transaction of its own, as events are applied
                with pool.connection() as conn:
                    report_status(
                        conn, project.id, StatusReport(status="SENT", message_id=message.id), now=T0
                    )

    threads = [threading.Thread(target=guarded(partial(queuer, s))) for s in range(3)]
    threads += [threading.Thread(target=guarded(claimer)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert counted(pool) == actual(pool)
    assert (
        sum(v for (kind, _), v in actual(pool).items() if kind == "project_queued")
        + len(rows(pool, "SELECT 1 FROM messages WHERE status <> 'QUEUED'"))
        == 120
    )
