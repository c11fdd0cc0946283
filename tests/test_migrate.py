from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from libs.common.core.migrate import available_migrations, migrate
from tests.conftest import with_database

#: The indexes the design rests on (seed 000 Data, DESIGN section 3).
HOT_INDEXES = {
    "followup_enrollments_one_live_idx": "UNIQUE INDEX",
    "followup_enrollments_dedupe_idx": "UNIQUE INDEX",
    "followup_enrollments_claim_idx": "INDEX",
    "followup_enrollments_live_contact_idx": "INDEX",
    "rule_pending_executions_due_idx": "INDEX",
    "rule_pending_executions_episode_key": "UNIQUE INDEX",
    "outbox_unpublished_idx": "INDEX",
    "messages_send_queue_idx": "INDEX",
}


def test_migrating_a_migrated_database_is_a_no_op(db_url: str) -> None:
    assert migrate(db_url) == []
    with psycopg.connect(db_url) as conn:
        versions = [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [m.version for m in available_migrations()]


@pytest.fixture
def empty_url(server_url: str) -> Iterator[str]:
    """A database of its own with nothing in it (not the migrated template), dropped afterwards."""
    name = f"followups_empty_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_concurrent_migrations_apply_each_file_once(empty_url: str) -> None:
    results: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(len(migrate(empty_url)))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(results) == [0, 0, len(available_migrations())]


@pytest.mark.parametrize(("index", "kind"), sorted(HOT_INDEXES.items()))
def test_hot_indexes_exist(db_url: str, index: str, kind: str) -> None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (index,)).fetchone()
    assert row is not None, f"index {index} is missing"
    assert row[0].startswith(f"CREATE {kind}")


def test_claim_and_stop_indexes_are_partial_on_live_status(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        defs: dict[str, str] = dict(
            conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'followup_enrollments'"
            )
        )
    assert "WHERE (status = 'active'::text)" in defs["followup_enrollments_claim_idx"]
    assert "(next_run_at)" in defs["followup_enrollments_claim_idx"]
    assert "(contact_id)" in defs["followup_enrollments_live_contact_idx"]
    assert "'active'::text, 'paused'::text" in defs["followup_enrollments_live_contact_idx"]
    assert "(sequence_id, contact_id)" in defs["followup_enrollments_one_live_idx"]


def test_a_contacts_last_inbound_time_is_backfilled_from_its_messages(empty_url: str) -> None:
    """Migration 0012 moves when a contact last wrote onto the contact: a database migrated before it gets
    each contact's latest inbound message time (outbound messages do not count; no message: NULL)."""
    assert [m.version for m in migrate(empty_url, through=11)] == list(range(1, 12))
    with psycopg.connect(empty_url, autocommit=True) as conn:
        [(project,)] = conn.execute("INSERT INTO projects (name) VALUES ('p') RETURNING id").fetchall()
        wrote, silent = (
            conn.execute(
                "INSERT INTO contacts (project_id, phone) VALUES (%s, %s) RETURNING id", (project, phone)
            ).fetchall()[0][0]
            for phone in ("+15550000001", "+15550000002")
        )
        for contact, direction, at in (
            (wrote, "inbound", "2030-01-01T09:00Z"),
            (wrote, "inbound", "2030-01-02T09:00Z"),
            (wrote, "outbound", "2030-01-03T09:00Z"),
            (silent, "outbound", "2030-01-03T09:00Z"),
        ):
            conn.execute(
                "INSERT INTO messages (project_id, contact_id, direction, status, source, created_at)"
                " VALUES (%s, %s, %s, 'SENT', 'contact', %s)",
                (project, contact, direction, at),
            )
    assert [m.version for m in migrate(empty_url)] == [m.version for m in available_migrations()][11:]
    with psycopg.connect(empty_url) as conn:
        found: dict[object, object] = dict(
            conn.execute("SELECT id, last_inbound_at FROM contacts").fetchall()
        )
    assert found == {wrote: datetime(2030, 1, 2, 9, tzinfo=UTC), silent: None}


def test_the_release_paths_hot_tables_are_vacuumed_early(db_url: str) -> None:
    """An enrollment row is rewritten at every step: its table (and the outbox) is vacuumed after 1-2 % of
    its rows changed, not PostgreSQL's default fifth, so dead claim index entries never pile up."""
    with psycopg.connect(db_url) as conn:
        options: dict[str, list[str]] = dict(
            conn.execute(
                "SELECT relname, reloptions FROM pg_class WHERE relname IN ('followup_enrollments', 'outbox')"
            ).fetchall()
        )
    assert "autovacuum_vacuum_scale_factor=0.01" in options["followup_enrollments"]
    assert "autovacuum_vacuum_scale_factor=0.02" in options["outbox"]
