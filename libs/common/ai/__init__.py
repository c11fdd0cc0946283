"""AI steps: the prompt, the OpenAI-compatible model client, and the step's model call between the release
service's first pass (a lease and a fence) and the second pass (every check again, under the lock).

Owns ``ai_budget_ledger``. May import: followups, platform, core and contracts.
"""

from __future__ import annotations

from typing import Final

#: The tables this context owns: it alone writes them (``tests/test_table_ownership.py`` checks it).
OWNS: Final = frozenset(
    {
        "ai_budget_ledger",
    }
)
