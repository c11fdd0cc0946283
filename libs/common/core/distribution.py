"""How the data would be spread over several PostgreSQL nodes (Citus; docs/scaling.md): by project.

Every table is a tenant table, distributed by :data:`DISTRIBUTION_COLUMN` and co-located with the others,
except the few global tables named in :data:`REFERENCE_TABLES` (a copy on every node). Migration 0024 made
``project_id`` lead every primary key, unique constraint and unique index of a tenant table and both sides
of every foreign key between two of them; every statement on a tenant table has an equality on
``project_id`` (but the walks before each project's claim and the few statements across projects that lock
no row: docs/scaling.md, "Claims by project"). ``tests/test_distribution.py``
reads the catalog and every statement and holds them to it.
"""

from __future__ import annotations

from typing import Final

#: The column every tenant table is distributed by.
DISTRIBUTION_COLUMN: Final = "project_id"

#: The global tables (Citus reference tables: small, read everywhere, rarely written), each with why it
#: cannot be distributed by project: what looks a row up does not know the project yet, or the table is the
#: projects themselves. Every other table is a tenant table.
REFERENCE_TABLES: Final[dict[str, str]] = {
    "projects": "the tenants themselves: every tenant table's project_id points at one",
    "api_keys": "a request's key is looked up by its hash before its project is known (the key says which)",
    "dashboard_sessions": "a dashboard request's session is looked up by its token's hash before its "
    "project is known, as an API key",
    "schema_migrations": "the migrations applied: one list for the whole database",
}
