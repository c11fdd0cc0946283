"""Enrollments of one contact that start at the same moment, each on its own connection."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.followups.definition import MessageStep
from libs.common.followups.enrollments import EnrollmentRejected, EnrollRequest, enroll
from tests.conftest import Project
from tests.factories import make_contact, make_sequence
from tests.helpers import rows

CLIENTS = 20


def _enroll_together(
    pool: ConnectionPool, project_id: uuid.UUID, request: EnrollRequest, now: datetime
) -> list[Any]:
    """``CLIENTS`` threads enroll at once (a barrier lines them up): each one's enrollment or rejection."""
    barrier = threading.Barrier(CLIENTS)
    outcomes: list[Any] = [None] * CLIENTS

    def client(index: int) -> None:
        with pool.connection() as conn:
            barrier.wait()
            try:
                outcomes[index] = enroll(conn, project_id, request, now=now)[0]
            except EnrollmentRejected as rejection:
                outcomes[index] = rejection

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def test_reentry_always_under_concurrency_replaces_the_live_enrollment_every_time(
    settings: Any, project: Project, clock: ManualClock
) -> None:
    # Given a sequence whose re-entry policy is always, and a pool with a connection per client
    with ConnectionPool(settings.database.url, min_size=CLIENTS, max_size=CLIENTS, open=True) as pool:
        sequence_id = make_sequence(
            pool, project.id, MessageStep(text="hi", delay_seconds=60), reentry="always"
        )
        contact_id = make_contact(pool, project.id)
        # When 20 clients enroll the same contact at the same moment
        request = EnrollRequest(sequence_id=sequence_id, contact_id=contact_id)
        outcomes = _enroll_together(pool, project.id, request, clock.now())
        # Then every one is enrolled (none refused as already enrolled): each replaced the one before
        assert [o for o in outcomes if isinstance(o, EnrollmentRejected)] == []
        assert len({o.id for o in outcomes}) == CLIENTS
        statuses = rows(
            pool,
            "SELECT status, reason, count(*) FROM followup_enrollments WHERE contact_id = %s"
            " GROUP BY 1, 2 ORDER BY 1",
            contact_id,
        )
    assert statuses == [("active", None, 1), ("stopped", "reentered", CLIENTS - 1)]


def test_reentry_after_finished_under_concurrency_enrolls_once_and_refuses_the_rest(
    settings: Any, project: Project, clock: ManualClock
) -> None:
    # Given the default policy (again only after the live enrollment finished)
    with ConnectionPool(settings.database.url, min_size=CLIENTS, max_size=CLIENTS, open=True) as pool:
        sequence_id = make_sequence(pool, project.id, MessageStep(text="hi", delay_seconds=60))
        contact_id = make_contact(pool, project.id)
        # When 20 clients enroll the same contact at the same moment
        request = EnrollRequest(sequence_id=sequence_id, contact_id=contact_id)
        outcomes = _enroll_together(pool, project.id, request, clock.now())
    # Then exactly one is enrolled and the others are told the contact already is
    enrolled = [o for o in outcomes if not isinstance(o, EnrollmentRejected)]
    assert len(enrolled) == 1
    assert {o.code for o in outcomes if isinstance(o, EnrollmentRejected)} == {"already_enrolled"}
