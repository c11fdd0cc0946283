"""Rules: "when EVENT happens and CONDITIONS hold, do ACTIONS", at once or after a delay (seed 002's
automation rules and seed 000's enrollment triggers, one model).

Owns ``rules``, ``rule_runs``, ``rule_pending_executions``, ``webhook_deliveries``, ``followup_triggers``,
``followup_bulk_jobs`` and ``followup_bulk_job_items`` (a segment is a condition tree: bulk jobs live here).
May import: followups, platform, core and contracts.
"""

from __future__ import annotations

from typing import Final

#: The tables this context owns: it alone writes them (``tests/test_table_ownership.py`` checks it).
OWNS: Final = frozenset(
    {
        "rules",
        "rule_runs",
        "rule_pending_executions",
        "webhook_deliveries",
        "followup_triggers",
        "followup_bulk_jobs",
        "followup_bulk_job_items",
    }
)
