"""The release loop's work: release due enrollments one transaction at a time (the domain's
:func:`~libs.common.followups.release.release_one`: claim, step, commit, count), up to a batch."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.settings import FollowupSettings
from libs.common.followups.release import release_one, seconds_until_next_due
from libs.common.followups.release_step import Released

__all__ = ["release_batch", "release_one", "seconds_until_next_due"]


def release_batch(
    pool: ConnectionPool,
    clock: Clock,
    settings: FollowupSettings,
    limit: int = 100,
    *,
    ai_lease: timedelta | None = None,
    on_lease: Callable[[Released], None] | None = None,
) -> int:
    """Release due enrollments one transaction at a time, up to ``limit``; returns how many were handled.
    ``on_lease`` hears of each AI step leased (after its commit)."""
    handled = 0
    while handled < limit:
        released = release_one(pool, clock, settings, ai_lease)
        if released is None:
            break
        if released.action == "lease" and on_lease is not None:
            on_lease(released)
        handled += 1
    return handled
