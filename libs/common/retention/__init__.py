"""Retention: what is deleted when, in small batches, each walking an index (see ``cleanup.py``).

Owns no table: a coordinator above the contexts it cleans (a layer with ``ingress``), it calls each
owner's batched delete (``followups.transitions``, ``rules.purge``, ``core.outbox``,
``platform.sessions``) for what they leave behind once its time is up. May import: rules, followups,
platform, core and contracts.
"""

from __future__ import annotations

from typing import Final

#: The tables this context owns: none (``tests/test_table_ownership.py`` checks it).
OWNS: Final[frozenset[str]] = frozenset()
