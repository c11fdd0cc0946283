"""A project's live-enrollment counter (``followup_live_counters``, migration 0027): what a plan limit reads
instead of counting the project's live enrollments.

Every path that changes an enrollment's status is driven here, through the API, the release path, the
events, campaigns, bulk jobs and retention, and after each the counter (the sum of the project's shards)
is compared with a ``count(*)`` of its live enrollments, for each project. Two enrollments racing for the
last slot of a plan, on two real connections, cannot both pass. The retention job recounts: a drift is
corrected, logged and counted.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups.enrollments import EnrollRequest, PlanLimitReached, enroll
from libs.common.retention.cleanup import run_retention
from tests.bulk_helpers import BULK, as_project, drain, opt_out, post_event
from tests.conftest import Project
from tests.factories import make_contact, make_sequence
from tests.helpers import rows, wait_until
from tests.test_api_sequences import message_step, new_contact, published, release, reply
from tests.test_bulk_campaigns import released


def live_counts(pool: ConnectionPool) -> dict[str, tuple[int, int]]:
    """Each project's (counter, count of live enrollments), for every project with either."""
    found = rows(
        pool,
        """
        SELECT p.id::text,
               (SELECT coalesce(sum(c.live), 0) FROM followup_live_counters c WHERE c.project_id = p.id),
               (SELECT count(*) FROM followup_enrollments e
                WHERE e.project_id = p.id AND e.status IN ('active', 'paused'))
        FROM projects p
        """,
    )
    return {project: (int(counter), int(live)) for project, counter, live in found if counter or live}


def assert_exact(pool: ConnectionPool, project: Project, live: int) -> None:
    counts = live_counts(pool)
    assert all(counter == actual for counter, actual in counts.values()), counts
    assert counts.get(str(project.id), (0, 0)) == (live, live), counts


def drift_total(direction: str) -> float:
    value = REGISTRY.get_sample_value("whatstig_followup_live_count_drift_total", {"direction": direction})
    return value or 0.0


def test_every_status_change_keeps_the_counter_equal_to_a_count(
    client: TestClient[Any],
    runtime: Runtime,
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    other_project: Project,
) -> None:
    later = published(client, message_step("later", delay_seconds=3600))
    # enroll: through the API, a sequence and a one-off of its own steps
    contacts = [new_contact(client) for _ in range(8)]
    ids = [
        client.post("/v1/enrollments", json={"sequence_id": later, "contact_id": c}).json()["id"]
        for c in contacts
    ]
    one_off = client.post("/v1/enrollments", json={"contact_id": contacts[0], "steps": [message_step("x")]})
    assert one_off.status_code == 201, one_off.text
    assert_exact(pool, project, 9)
    # a refused enrollment (already enrolled) counts nothing
    assert (
        client.post("/v1/enrollments", json={"sequence_id": later, "contact_id": contacts[1]}).status_code
        == 409
    )
    assert_exact(pool, project, 9)
    # pause and resume keep it live
    assert client.post(f"/v1/enrollments/{ids[1]}/pause").status_code == 200
    assert_exact(pool, project, 9)
    assert client.post(f"/v1/enrollments/{ids[1]}/resume").status_code == 200
    # stop by hand, twice (the second is a 409 and counts nothing)
    assert client.post(f"/v1/enrollments/{ids[1]}/stop").status_code == 200
    assert client.post(f"/v1/enrollments/{ids[1]}/stop").status_code == 409
    assert_exact(pool, project, 8)
    # a paused one stopped
    assert client.post(f"/v1/enrollments/{ids[2]}/pause").status_code == 200
    assert client.post(f"/v1/enrollments/{ids[2]}/stop").status_code == 200
    assert_exact(pool, project, 7)
    # opt-out stops the contact's enrollments (the sequence's and the one-off)
    opt_out(client, contacts[0])
    assert_exact(pool, project, 5)
    # erasure
    post_event(client, {"type": "contact.erased", "contact_id": contacts[3]})
    assert_exact(pool, project, 4)
    # re-entry always: the live one is replaced (stopped, enrolled anew)
    always = published(client, message_step("again", delay_seconds=3600), reentry="always")
    assert (
        client.post("/v1/enrollments", json={"sequence_id": always, "contact_id": contacts[4]}).status_code
        == 201
    )
    assert (
        client.post("/v1/enrollments", json={"sequence_id": always, "contact_id": contacts[4]}).status_code
        == 201
    )
    assert_exact(pool, project, 5)
    # completion: a sequence of one message due now, released
    now = published(client, message_step("now"))
    for contact in contacts[5:7]:
        assert (
            client.post("/v1/enrollments", json={"sequence_id": now, "contact_id": contact}).status_code
            == 201
        )
    assert_exact(pool, project, 7)
    assert release(runtime) >= 2
    assert_exact(pool, project, 5)
    # a reply stops an enrollment waiting for its next step
    chase = published(client, message_step("first"), message_step("second", delay_seconds=600))
    assert (
        client.post("/v1/enrollments", json={"sequence_id": chase, "contact_id": contacts[7]}).status_code
        == 201
    )
    release(runtime)
    assert_exact(pool, project, 6)
    reply(pool, contacts[7], clock.now() + timedelta(seconds=1))
    clock.advance(timedelta(seconds=601))
    release(runtime)
    assert rows(pool, "SELECT status FROM followup_enrollments WHERE sequence_id = %s", chase) == [
        ("stopped",)
    ]
    assert_exact(pool, project, 5)
    # a campaign's released recipient
    campaign_id = str(uuid.uuid4())
    assert (
        client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": later, "name": "c"}).status_code
        == 200
    )
    recipient = new_contact(client)
    post_event(client, released(campaign_id, str(uuid.uuid4()), recipient))
    assert_exact(pool, project, 6)
    # a bulk job: some enrolled, some already enrolled
    fresh = [new_contact(client) for _ in range(5)]
    job = client.post(BULK, json={"sequence_id": later, "contact_ids": [*fresh, *contacts[4:7]]})
    assert job.status_code == 202, job.text
    drain(runtime, 3)
    assert_exact(pool, project, 11)
    # another project's enrollments are its own
    with as_project(client, other_project):
        theirs = published(client, message_step("theirs", delay_seconds=3600))
        for _ in range(2):
            response = client.post(
                "/v1/enrollments", json={"sequence_id": theirs, "contact_id": new_contact(client)}
            )
            assert response.status_code == 201
    assert_exact(pool, other_project, 2)
    assert_exact(pool, project, 11)
    # retention deletes finished enrollments past their time: the live count is unchanged, and exact
    clock.advance(timedelta(days=91))
    assert run_retention(pool, clock.now) is True
    assert rows(
        pool,
        "SELECT count(*) FROM followup_enrollments WHERE project_id = %s AND finished_at IS NOT NULL",
        project.id,
    ) == [(0,)]
    assert_exact(pool, project, 11)


def test_two_enrollments_racing_for_the_last_slot_do_not_both_pass(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # Given a plan of 3 live enrollments, 2 used
    sequence_id = make_sequence(pool, project.id)
    with pool.connection() as conn:
        conn.execute("UPDATE projects SET max_active_enrollments = 3 WHERE id = %s", (project.id,))
        for _ in range(2):
            request = EnrollRequest(sequence_id=sequence_id, contact_id=make_contact(pool, project.id))
            enroll(conn, project.id, request, now=clock.now())
    first, second = make_contact(pool, project.id), make_contact(pool, project.id)
    outcome: list[Any] = []

    # When one connection enrolls and has not committed, and a second enrolls meanwhile
    with pool.connection() as one:
        enroll(one, project.id, EnrollRequest(sequence_id=sequence_id, contact_id=first), now=clock.now())

        def other() -> None:
            with pool.connection() as two:
                try:
                    request = EnrollRequest(sequence_id=sequence_id, contact_id=second)
                    outcome.append(enroll(two, project.id, request, now=clock.now()))
                except PlanLimitReached as refusal:
                    outcome.append(refusal)

        racer = threading.Thread(target=other)
        racer.start()
        # the second waits for the first (the project's lock), then the first commits
        wait_until(
            lambda: (
                rows(
                    pool,
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()",
                )[0][0]
                == 1
            ),
            what="the second enrollment waits for the first",
        )
    racer.join(10)

    # Then the second was refused: the plan is full, not over
    assert len(outcome) == 1 and isinstance(outcome[0], PlanLimitReached), outcome
    assert_exact(pool, project, 3)


def test_retention_recounts_and_corrects_a_drift_logged_and_counted(
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    other_project: Project,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given two live enrollments in each project, the counter of one project says 7 more, the other's 1 less
    sequences = {p.id: make_sequence(pool, p.id) for p in (project, other_project)}
    with pool.connection() as conn:
        for p in (project, other_project):
            for _ in range(2):
                request = EnrollRequest(sequence_id=sequences[p.id], contact_id=make_contact(pool, p.id))
                enroll(conn, p.id, request, now=clock.now())
        # (shard 9 may be the enrollments' own: a shard is the backend's pid & 15)
        conn.execute(
            "INSERT INTO followup_live_counters AS c VALUES (%s, 9, 7)"
            " ON CONFLICT (project_id, shard) DO UPDATE SET live = c.live + 7",
            (project.id,),
        )
        conn.execute(
            "UPDATE followup_live_counters SET live = live - 1 WHERE project_id = %s"
            " AND shard = (SELECT min(shard) FROM followup_live_counters WHERE project_id = %s AND live > 0)",
            (other_project.id, other_project.id),
        )
    assert live_counts(pool)[str(project.id)] == (9, 2)
    assert live_counts(pool)[str(other_project.id)] == (1, 2)
    over, under = drift_total("over"), drift_total("under")

    # When the retention job runs
    with caplog.at_level(logging.WARNING, logger="libs.common.retention.cleanup"):
        assert run_retention(pool, clock.now) is True

    # Then both counters are exact again, the drifts counted and logged with the project (the database is
    # shared with other tests' projects, whose counters a test may have left off by writing rows directly:
    # the metric counts every correction the log names)
    assert_exact(pool, project, 2)
    assert_exact(pool, other_project, 2)
    corrected = {
        r.project_id: (r.live, r.counted)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "live enrollment count corrected"
    }
    assert corrected[str(project.id)] == (2, 9)
    assert corrected[str(other_project.id)] == (2, 1)
    logged_over = sum(counted - live for live, counted in corrected.values() if counted > live)
    logged_under = sum(live - counted for live, counted in corrected.values() if counted < live)
    assert (drift_total("over") - over, drift_total("under") - under) == (logged_over, logged_under)
    # and a second run finds nothing to correct in these projects
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="libs.common.retention.cleanup"):
        assert run_retention(pool, clock.now) is True
    assert not {
        r.project_id  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "live enrollment count corrected"
    } & {str(project.id), str(other_project.id)}
    assert_exact(pool, project, 2)
    assert_exact(pool, other_project, 2)


def test_a_recount_that_finds_a_shard_held_is_postponed_without_holding_the_others(
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a project whose counter says 5 too many, and a long transaction holding one of its shards (not
    # the one of the connection that enrolls next)
    sequence = make_sequence(pool, project.id)
    with pool.connection() as conn:
        request = EnrollRequest(sequence_id=sequence, contact_id=make_contact(pool, project.id))
        enroll(conn, project.id, request, now=clock.now())
    with pool.connection() as enrolling, pool.connection() as holder:
        shard = enrolling.execute("SELECT pg_backend_pid() & 15").fetchone()
        assert shard is not None
        held = (shard[0] + 1) % 16
        enrolling.commit()
        holder.execute(
            "INSERT INTO followup_live_counters VALUES (%s, %s, 5)"
            " ON CONFLICT (project_id, shard) DO UPDATE SET live = followup_live_counters.live + 5",
            (project.id, held),
        )
        holder.commit()
        holder.execute(
            "SELECT 1 FROM followup_live_counters WHERE project_id = %s AND shard = %s FOR UPDATE",
            (project.id, held),
        )

        # When the retention job runs meanwhile
        with caplog.at_level(logging.INFO, logger="libs.common.retention.cleanup"):
            assert run_retention(pool, clock.now) is True

        # Then the project's recount is postponed (logged), the counter left as it was and no shard kept
        # locked: an enrollment of the project goes through at once
        assert any(
            r.getMessage() == "live enrollment recount postponed: its counter is held"
            and r.project_id == str(project.id)  # type: ignore[attr-defined]
            for r in caplog.records
        )
        assert live_counts(pool)[str(project.id)] == (6, 1)
        enrolling.execute("SET lock_timeout = '5s'")
        request = EnrollRequest(sequence_id=sequence, contact_id=make_contact(pool, project.id))
        enroll(enrolling, project.id, request, now=clock.now())
        enrolling.execute("SET lock_timeout = 0")
        enrolling.commit()

    # And the next run, the shard free, corrects it
    assert run_retention(pool, clock.now) is True
    assert_exact(pool, project, 2)
