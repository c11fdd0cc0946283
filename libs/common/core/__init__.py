"""Infrastructure every context stands on: the clock, database access and named SQL, domain errors,
settings, logs, metrics, input validation, polling loops, the process runtime, cron schedules, the broker,
schema migrations, the transactional outbox, recorded reasons (a code and its detail), and how the tables
are distributed (by project, but the named reference tables).

Owns: ``schema_migrations``, ``outbox``. May import: ``contracts`` (nothing else of ``libs.common``).
"""

from __future__ import annotations

from typing import Final

#: The tables this context owns: it alone writes them (``tests/test_table_ownership.py`` checks it).
OWNS: Final = frozenset(
    {
        "schema_migrations",
        "outbox",
    }
)
