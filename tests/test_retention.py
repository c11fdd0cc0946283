"""Retention deletes what is past its time, in batches, leaves the rest, runs in one process at a time, and
reports success only when every step succeeded."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.clock import SYSTEM_CLOCK, ManualClock
from libs.common.core.db import create_pool
from libs.common.core.errors import DatabaseUnavailable
from libs.common.core.settings import DatabaseSettings
from libs.common.platform.projects import create_project
from libs.common.retention import cleanup
from libs.common.retention.cleanup import run_retention
from libs.common.rules import purge as rules_purge
from tests.conftest import Project
from tests.factories import make_contact, make_sequence
from tests.helpers import rows, wait_until
from tests.tcp_proxy import proxied_postgres


def deleted_total(table: str) -> float:
    return REGISTRY.get_sample_value("whatstig_retention_rows_deleted_total", {"table": table}) or 0.0


def count(pool: ConnectionPool, sql: str, *params: Any) -> int:
    [(value,)] = rows(pool, sql, *params)
    return int(value)


def seed(pool: ConnectionPool, project: Project, now: datetime) -> dict[str, Any]:
    """Rows just past and just within each period."""
    contact = make_contact(pool, project.id)
    sequence = make_sequence(pool, project.id)
    with pool.connection() as conn:
        version = conn.execute(
            "SELECT current_version_id FROM followup_sequences WHERE id = %s", (sequence,)
        ).fetchone()
        assert version is not None

        def enrollment(status: str, finished_days_ago: float | None) -> uuid.UUID:
            finished = now - timedelta(days=finished_days_ago) if finished_days_ago is not None else None
            row = conn.execute(
                "INSERT INTO followup_enrollments (project_id, version_id, contact_id, status, next_run_at,"
                " enrolled_at, updated_at, finished_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                (project.id, version[0], contact, status, now, now, now, finished),
            ).fetchone()
            assert row is not None
            conn.execute(
                "INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, due_at,"
                " ran_at) VALUES (%s, 0, %s, 'queued', %s, %s)",
                (row[0], project.id, now, now),
            )
            return uuid.UUID(str(row[0]))

        ids: dict[str, Any] = {
            "old_done": enrollment("completed", 91),
            "old_stopped": enrollment("stopped", 120),
            "recent_done": enrollment("completed", 89),
            "old_but_active": enrollment("active", None),
        }

        def trigger(processed_days_ago: float | None) -> int:
            processed = now - timedelta(days=processed_days_ago) if processed_days_ago is not None else None
            row = conn.execute(
                "INSERT INTO followup_triggers (project_id, type, contact_id, occurred_at, next_attempt_at,"
                " processed_at) VALUES (%s, 'contact.created', %s, %s, %s, %s) RETURNING id",
                (project.id, contact, now, now, processed),
            ).fetchone()
            assert row is not None
            return int(row[0])

        ids |= {"old_trigger": trigger(8), "recent_trigger": trigger(6), "unprocessed": trigger(None)}
        ids["needed_trigger"] = trigger(30)
        rule = conn.execute(
            "INSERT INTO rules (project_id, name, event, actions) VALUES (%s, 'r', 'contact.created', '[]')"
            " RETURNING id",
            (project.id,),
        ).fetchone()
        assert rule is not None
        conn.execute(
            "INSERT INTO rule_pending_executions (project_id, rule_id, contact_id, trigger_id, episode_key,"
            " due_at, status, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, 'event:1', %s, 'pending', %s, %s)",
            (project.id, rule[0], contact, ids["needed_trigger"], now, now, now),
        )
        for days, status in ((31, "executed"), (29, "skipped"), (40, "pending")):
            conn.execute(
                "INSERT INTO rule_pending_executions (project_id, rule_id, contact_id, episode_key, due_at,"
                " status, created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (project.id, rule[0], contact, f"event:{days}", now, status, now, now - timedelta(days=days)),
            )
        for days in (8, 6):
            conn.execute(
                "INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at,"
                " published_at) VALUES (%s, 'x', 'y', %s, '{}', %s, %s)",
                (project.id, uuid.uuid4(), now, now - timedelta(days=days)),
            )
        conn.execute(
            "INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)"
            " VALUES (%s, 'unpublished', 'y', %s, '{}', %s)",
            (project.id, uuid.uuid4(), now),
        )
    return ids


def test_retention_deletes_what_is_past_its_time_and_keeps_the_rest(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    now = clock.now()
    ids = seed(pool, project, now)
    before = {table: deleted_total(table) for table, _, _ in cleanup.STEPS}

    assert run_retention(pool, clock.now) is True

    left = {row[0] for row in rows(pool, "SELECT id FROM followup_enrollments")}
    assert left == {ids["recent_done"], ids["old_but_active"]}
    assert count(pool, "SELECT count(*) FROM followup_step_runs") == 2  # the deleted ones' went with them
    triggers = {row[0] for row in rows(pool, "SELECT id FROM followup_triggers")}
    assert triggers == {ids["recent_trigger"], ids["unprocessed"], ids["needed_trigger"]}
    assert sorted(row[0] for row in rows(pool, "SELECT status FROM rule_pending_executions")) == [
        "pending",
        "pending",
        "skipped",
    ]
    assert sorted(
        row[0] for row in rows(pool, "SELECT type FROM outbox WHERE type IN ('x', 'unpublished')")
    ) == [
        "unpublished",
        "x",
    ]
    assert deleted_total("followup_enrollments") - before["followup_enrollments"] == 2
    assert deleted_total("followup_triggers") - before["followup_triggers"] == 1
    assert deleted_total("rule_pending_executions") - before["rule_pending_executions"] == 1
    assert deleted_total("outbox") - before["outbox"] >= 1


def test_a_project_keeps_its_enrollments_as_long_as_its_retention_days_say(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    now = clock.now()
    ids = seed(pool, project, now)
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO followup_settings (project_id, retention_days) VALUES (%s, 100)", (project.id,)
        )
    assert run_retention(pool, clock.now) is True
    left = {row[0] for row in rows(pool, "SELECT id FROM followup_enrollments")}
    assert left == {ids["old_done"], ids["recent_done"], ids["old_but_active"]}  # 91 days < 100


def test_retention_deletes_in_batches_until_nothing_is_left(
    pool: ConnectionPool, clock: ManualClock, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = clock.now()
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at,"
            " published_at) SELECT %s, 'x', 'y', gen_random_uuid(), '{}', %s, %s FROM generate_series(1, 25)",
            (project.id, now, now - timedelta(days=8)),
        )
    monkeypatch.setattr(
        cleanup, "STEPS", tuple((t, q, 4 if t == "outbox" else n) for t, q, n in cleanup.STEPS)
    )
    assert run_retention(pool, clock.now) is True
    assert count(pool, "SELECT count(*) FROM outbox WHERE type = 'x'") == 0


def test_the_job_runs_in_one_process_at_a_time(pool: ConnectionPool, clock: ManualClock) -> None:
    with pool.connection() as holder:
        holder.autocommit = True
        holder.execute(cleanup.QUERIES["try_lock"])
        try:
            assert run_retention(pool, clock.now) is None  # another process holds the job
        finally:
            holder.execute(cleanup.QUERIES["unlock"])
    assert run_retention(pool, clock.now) is True


def test_a_failing_step_fails_the_run_but_the_other_steps_still_run(
    pool: ConnectionPool, clock: ManualClock, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = clock.now()
    ids = seed(pool, project, now)
    broken = dict(rules_purge.QUERIES) | {"processed_triggers": "DELETE FROM no_such_table"}
    monkeypatch.setattr(rules_purge, "QUERIES", broken)
    assert run_retention(pool, clock.now) is False
    left = {row[0] for row in rows(pool, "SELECT id FROM followup_enrollments")}
    assert ids["old_done"] not in left  # the step before ran
    assert count(pool, "SELECT count(*) FROM outbox WHERE type = 'x'") == 1  # and the steps after


def test_a_run_cut_by_a_lost_database_stops_quietly_and_the_next_one_runs_through(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL lost mid-run (a failover): the run stops at that step with DatabaseUnavailable, logging
    no error and no traceback (the outage's one warning is the pool's); its advisory lock ends with its
    session, so the next run, once the server answers, takes it and runs every step."""
    with psycopg.connect(db_url) as conn:
        create_project(conn, "retention cut")  # a project: the steps run project by project
    proxy, url = proxied_postgres(db_url)
    proxied = create_pool(DatabaseSettings(url=url, pool_min_size=1, pool_max_size=4), name="retention-cut")
    first_table, first_purge, first_limit = cleanup.STEPS[0]
    calls: list[str] = []

    def purge_then_lose_the_server(conn: Any, project_id: uuid.UUID, *, now: datetime, limit: int) -> int:
        calls.append(first_table)
        if len(calls) == 1:
            proxy.down()  # every connection through the proxy drops, the lock's too
        return first_purge(conn, project_id, now=now, limit=limit)

    monkeypatch.setattr(
        cleanup, "STEPS", ((first_table, purge_then_lose_the_server, first_limit), *cleanup.STEPS[1:])
    )
    try:
        # When the server is lost during the first step
        with caplog.at_level(logging.INFO), pytest.raises(DatabaseUnavailable):
            run_retention(proxied, SYSTEM_CLOCK.now)
        # Then the run stopped there, with no error line and no traceback
        assert calls == [first_table]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text

        # And once the server answers again, the next run takes the lock and runs every step
        proxy.up()

        def ran_through() -> bool:
            try:
                return run_retention(proxied, SYSTEM_CLOCK.now) is True
            except DatabaseUnavailable:  # the pool still reconnecting
                return False

        wait_until(ran_through, timeout=30)
        assert len(calls) >= 2
    finally:
        proxied.close()
        proxy.close()
