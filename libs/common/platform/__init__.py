"""The platform core: the parts of a messaging platform the engine needs, owned here so the engine runs on
its own. Projects, API keys and dashboard sessions, contacts (opt-out, consent, erasure, activities),
conversations, messages (the one shared send function, inbound and human messages, cancellation), the send
lane's claim and status reports, leads and deals.

Owns: ``projects``, ``api_keys``, ``dashboard_sessions``, ``numbers``, ``contacts``, ``activities``,
``conversations``, ``messages``, ``message_status_events``, ``message_counters`` (kept by a trigger on
``messages``), ``usage_counters``, ``leads``, ``deals``, ``portfolios`` with ``portfolio_recipients`` and
``portfolio_openings`` (a portfolio's messaging limit, :mod:`~libs.common.platform.portfolios`).
May import: ``core``, ``contracts``. Knows nothing of follow-ups: stop paths run above it (``ingress``).
"""

from __future__ import annotations

from typing import Final

#: The tables this context owns: it alone writes them (``tests/test_table_ownership.py`` checks it).
OWNS: Final = frozenset(
    {
        "projects",
        "api_keys",
        "dashboard_sessions",
        "numbers",
        "contacts",
        "activities",
        "conversations",
        "messages",
        "message_status_events",
        "message_counters",
        "usage_counters",
        "leads",
        "deals",
        "portfolios",
        "portfolio_recipients",
        "portfolio_openings",
    }
)
