"""Ordered SQL migrations, applied under an advisory lock; running them again is a no-op."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString

import psycopg

log = logging.getLogger(__name__)

#: Key of the session advisory lock that serialises concurrent `followups migrate` runs.
MIGRATION_LOCK_KEY = 7_301_552_018

_FILENAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: LiteralString


def available_migrations() -> list[Migration]:
    """Every migration shipped with the package, in order."""
    found = []
    for entry in resources.files("libs.common.core.migrations").iterdir():
        match = _FILENAME.match(entry.name)
        if match:
            sql: LiteralString = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match.group(1)), match.group(2), sql))
    found.sort(key=lambda m: m.version)
    return found


def migrate(url: str, *, through: int | None = None) -> list[Migration]:
    """Apply the migrations the database lacks (up to version ``through``, when given); returns the ones
    applied."""
    applied: list[Migration] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
            for migration in available_migrations():
                if migration.version in done:
                    continue
                if through is not None and migration.version > through:
                    break
                with conn.transaction():
                    conn.execute(migration.sql)
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                log.info(
                    "migration applied", extra={"version": migration.version, "migration": migration.name}
                )
                applied.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied
