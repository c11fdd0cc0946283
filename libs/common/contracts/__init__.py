"""The shared language: what crosses a process boundary, in msgspec structs that import no domain code.

    actors            queues, actor names and their payloads (services send to each other through these)
    events            one struct per outbox event type (the ``data`` of each published event)
    platform_events   the platform events the engine takes (REST ``POST /v1/events`` and the ingress actor)

May import: nothing of ``libs.common`` (every context may import it).
"""

from __future__ import annotations

from typing import Final

#: The tables this context owns: none (``tests/test_table_ownership.py`` checks it).
OWNS: Final[frozenset[str]] = frozenset()
