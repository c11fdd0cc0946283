from __future__ import annotations

import threading

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


def test_concurrent_migrations_apply_each_file_once(server_url: str) -> None:
    name = "followups_concurrent_migrate"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    results: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(len(migrate(url)))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert sorted(results) == [0, 0, len(available_migrations())]
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
