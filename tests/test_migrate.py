from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from followups.schema import HEADER, SCHEMA_PATH, tidy
from libs.common.core.migrate import available_migrations, migrate
from tests.conftest import with_database

#: The indexes the design rests on (seed 000 Data, DESIGN section 3).
HOT_INDEXES = {
    "followup_enrollments_one_live_idx": "UNIQUE INDEX",
    "followup_enrollments_dedupe_idx": "UNIQUE INDEX",
    "followup_enrollments_project_claim_idx": "INDEX",
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
    assert "WHERE (status = 'active'::text)" in defs["followup_enrollments_project_claim_idx"]
    assert "(project_id, next_run_at)" in defs["followup_enrollments_project_claim_idx"]
    assert "(contact_id)" in defs["followup_enrollments_live_contact_idx"]
    assert "'active'::text, 'paused'::text" in defs["followup_enrollments_live_contact_idx"]
    assert "(project_id, sequence_id, contact_id)" in defs["followup_enrollments_one_live_idx"]


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


#: Every queue a service claims from, and the most of its rows that may be dead before it is vacuumed: a row
#: rewritten at each step or attempt leaves a dead entry in the partial index its claim walks from the oldest
#: end, so it is vacuumed after 1-2 % of its rows changed (or a few hundred changes, for a small table), not
#: PostgreSQL's default fifth.
QUEUES = {
    "followup_enrollments": 0.01,
    "outbox": 0.02,
    "followup_triggers": 0.01,
    "rule_pending_executions": 0.02,
    "webhook_deliveries": 0.02,
    "channel_sends": 0,
}


def test_every_queue_is_vacuumed_early_without_cost_pauses(db_url: str) -> None:
    """Each queue's dead claim index entries never pile up: its table is vacuumed after at most its share of
    dead rows (:data:`QUEUES`), with no cost pauses."""
    with psycopg.connect(db_url) as conn:
        options: dict[str, dict[str, str]] = {
            name: dict(option.split("=", 1) for option in reloptions or [])
            for name, reloptions in conn.execute(
                "SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s) AND relkind = 'r'",
                (list(QUEUES),),
            )
        }
    assert set(options) == set(QUEUES)
    for table, most in QUEUES.items():
        assert float(options[table]["autovacuum_vacuum_scale_factor"]) == most, table
        assert int(options[table]["autovacuum_vacuum_threshold"]) <= 1000, table
        assert options[table]["autovacuum_vacuum_cost_delay"] == "0", table


#: The catalog of the public schema, one sorted list of lines per kind of object: what the canonical
#: schema and the migrations must agree on (names, types, defaults, constraints, indexes, triggers,
#: functions, storage options), whatever the order or spelling of the statements that made them.
CATALOG: dict[str, str] = {
    "columns": """
        SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
               || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid AND c.relkind IN ('r', 'p', 'v', 'm')
        JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace""",
    "indexes": "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "triggers": """
        SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid AND c.relnamespace = 'public'::regnamespace
        WHERE NOT t.tgisinternal""",
    "functions": """
        SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace""",
    "views": """
        SELECT viewname || ' ' || definition FROM pg_views WHERE schemaname = 'public'""",
    "relations": """
        SELECT relname || ' ' || relkind::text || ' ' || coalesce(array_to_string(reloptions, ','), '')
        FROM pg_class WHERE relnamespace = 'public'::regnamespace""",
    "types": """
        SELECT t.typname || ' ' || t.typtype::text FROM pg_type t
        WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('e', 'd', 'c')
          AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid)""",
}


def catalog(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        return {kind: sorted(row[0] for row in conn.execute(query)) for kind, query in CATALOG.items()}


def test_the_canonical_schema_is_what_the_migrations_make(db_url: str, empty_url: str) -> None:
    """``libs/common/core/schema.sql`` (every table in one file, for readers) describes exactly the schema
    the migrations leave: applied to an empty database, it gives the same catalog as all migrations.
    When this fails after a new migration, ``make schema`` writes the file anew."""
    with psycopg.connect(empty_url, autocommit=True) as conn:
        conn.execute(SCHEMA_PATH.read_text(encoding="utf-8"))
    migrated, canonical = catalog(db_url), catalog(empty_url)
    for kind in CATALOG:
        assert canonical[kind] == migrated[kind], f"schema.sql is out of date ({kind}): run `make schema`"
    assert sum(len(lines) for lines in migrated.values()) > 100  # the catalog did read the schema


def test_the_canonical_schema_is_tidy() -> None:
    """The file holds the schema, not the dump's session settings or version banner."""
    text = SCHEMA_PATH.read_text(encoding="utf-8")
    assert text.startswith(HEADER)
    assert tidy(text) == text
    assert "CREATE TABLE public.followup_enrollments (" in text
    assert not any(line.startswith(("SET ", "-- Dumped")) for line in text.splitlines())


#: What a row of each table is named by in the 0012-era snapshot (its key then), and the columns a later
#: migration changed on purpose (webhook_deliveries.trigger_id became the trigger's public id, 0014).
_KEYS_0012 = {
    "activities": ("id",),
    "ai_budget_ledger": ("id",),
    "api_keys": ("id",),
    "contacts": ("id",),
    "conversations": ("project_id", "id"),
    "deals": ("project_id", "id"),
    "followup_bulk_job_items": ("job_id", "position"),
    "followup_bulk_jobs": ("id",),
    "followup_campaigns": ("project_id", "id"),
    "followup_enrollments": ("id",),
    "followup_instance_pacing": ("number_id",),
    "followup_sequence_versions": ("id",),
    "followup_sequences": ("id",),
    "followup_settings": ("project_id",),
    "followup_step_runs": ("enrollment_id", "step_index"),
    "followup_triggers": ("id",),
    "leads": ("project_id", "id"),
    "message_counters": ("kind", "owner_id", "shard"),
    "message_status_events": ("id",),
    "messages": ("id",),
    "numbers": ("id",),
    "outbox": ("id",),
    "projects": ("id",),
    "rule_pending_executions": ("id",),
    "rule_runs": ("trigger_id", "rule_id"),
    "rules": ("id",),
    "usage_counters": ("project_id", "month", "shard"),
    "webhook_deliveries": ("id",),
}
_CHANGED_SINCE_0012 = {"webhook_deliveries": {"trigger_id"}}


def _snapshot(conn: psycopg.Connection[Any], tables: dict[str, tuple[str, ...]]) -> dict[str, dict[Any, Any]]:
    """Every row of each table as a dict of its columns, by its key (jsonb: comparable across migrations)."""
    found: dict[str, dict[Any, Any]] = {}
    for table, key in tables.items():
        rows = [row[0] for row in conn.execute(f"SELECT to_jsonb(t) FROM {table} t")]
        found[table] = {tuple(str(row[k]) for k in key): row for row in rows}
    return found


#: Rows of every kind the 0012 schema had (statements separated by ``;`` at a line's end, ids as named
#: parameters).
ROWS_0012 = (Path(__file__).parent / "rows_0012.sql").read_text(encoding="utf-8")


def test_a_0012_database_keeps_every_row_its_project_and_its_relationships(empty_url: str) -> None:
    """Migration 0024 rebuilds every key of the tenant tables with project_id first: a database migrated
    to 0012 (before API key scopes, sessions, channels and the project-led keys) with rows of every kind
    comes out with each row as it was, the project it had, a project_id given to the rows that had none
    (a bulk job's contacts, the message counters), and every reference within the project."""
    # Given a database migrated up to 0012, with two projects' rows of every kind
    assert [m.version for m in migrate(empty_url, through=12)] == list(range(1, 13))
    names = set(re.findall(r"%\((\w+)\)s", ROWS_0012)) - {"at", "definition"}
    ids: dict[str, Any] = {name: uuid.uuid4() for name in names}
    params = ids | {
        "at": datetime(2030, 1, 1, 9, tzinfo=UTC),
        "definition": Jsonb({"steps": [{"type": "message", "text": "hi"}]}),
    }
    with psycopg.connect(empty_url, autocommit=True) as conn:
        for statement in ROWS_0012.split(";\n"):
            conn.execute(statement.encode(), params)
        before = _snapshot(conn, _KEYS_0012)
    assert all(before[table] for table in _KEYS_0012), [t for t in _KEYS_0012 if not before[t]]
    counters = {(row["kind"], row["owner_id"]) for row in before["message_counters"].values()}
    assert counters == {("number_in_flight", str(ids["number"])), ("project_queued", str(ids["p"]))}

    # When it is migrated to the end
    assert [m.version for m in migrate(empty_url)] == [m.version for m in available_migrations()][12:]

    # Then every row is there, each column as it was, with its project
    with psycopg.connect(empty_url) as conn:
        after = _snapshot(conn, _KEYS_0012)
        public_trigger = conn.execute("SELECT public_id FROM followup_triggers").fetchone()
    for table, rows_before in before.items():
        assert after[table].keys() == rows_before.keys(), table
        for key, row in rows_before.items():
            kept = {c: v for c, v in after[table][key].items() if c in row}
            changed = _CHANGED_SINCE_0012.get(table, set())
            assert {c: v for c, v in kept.items() if c not in changed} == {
                c: v for c, v in row.items() if c not in changed
            }, (table, key)
    # the rows without a project_id took their parent's
    assert {row["project_id"] for row in after["followup_bulk_job_items"].values()} == {str(ids["p"])}
    assert {row["project_id"] for row in after["message_counters"].values()} == {str(ids["p"])}
    assert public_trigger is not None
    assert after["webhook_deliveries"][(str(ids["delivery"]),)]["trigger_id"] == str(public_trigger[0])
    # every row of a tenant table has its project (the other project's rows stay its own)
    theirs = {str(ids[name]) for name in ("theirs", "their_sequence", "their_version", "their_enrollment")}
    for table, rows_after in after.items():
        for row in rows_after.values():
            if table == "projects":
                continue
            project = str(ids["q"]) if theirs & {str(v) for v in row.values()} else str(ids["p"])
            assert row["project_id"] == project, (table, row)
    # and each reference is within the project: the foreign keys (project_id, ...) hold, and find their rows
    with psycopg.connect(empty_url) as conn:
        joined = conn.execute(
            """
            SELECT count(*) FROM followup_enrollments e
            JOIN contacts c ON c.project_id = e.project_id AND c.id = e.contact_id
            JOIN followup_sequence_versions v ON v.project_id = e.project_id AND v.id = e.version_id
            JOIN followup_step_runs r ON r.project_id = e.project_id AND r.enrollment_id = e.id
            JOIN messages m ON m.project_id = r.project_id AND m.id = r.message_id
            JOIN message_status_events s ON s.project_id = m.project_id AND s.message_id = m.id
            JOIN rule_pending_executions x ON x.project_id = e.project_id AND x.contact_id = c.id
            JOIN rules u ON u.project_id = x.project_id AND u.id = x.rule_id
            JOIN rule_runs rr ON rr.project_id = x.project_id AND rr.trigger_id = x.trigger_id
                             AND rr.rule_id = u.id
            JOIN followup_bulk_job_items i ON i.project_id = e.project_id AND i.contact_id = c.id
            JOIN followup_bulk_jobs j ON j.project_id = i.project_id AND j.id = i.job_id
                                     AND j.sequence_id = e.sequence_id
            """
        ).fetchone()
        violations = conn.execute(
            "SELECT conrelid::regclass, conname FROM pg_constraint WHERE contype = 'f' AND NOT convalidated"
        ).fetchall()
    assert joined == (2,)  # the queued step's message, once per status event
    assert violations == []
