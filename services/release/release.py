"""The release loop's work: release due enrollments one transaction at a time (the domain's
:class:`~libs.common.followups.release.Chain`: claim, step, commit, count; each COMMIT sent with the next
claim), up to a batch, in turns across projects, on one connection held for the batch (no pool checkout per
step).

A batch walks the projects with due enrollments from where this loop's previous walk stopped (a
:class:`~libs.common.core.jobs.RoundRobin`, wrapping around), at most what is left of the batch of them,
and releases up to an even share of what is left from each (at least one, at most :data:`TURN`: a turn),
then walks them again, until the batch is done or a walk releases nothing: a project with 100,000 due
steps gets one share per turn like a project with one, so its backlog delays no other project's step by
more than a turn. Each claim names its project (one shard on Citus). The walk is read in a transaction of
its own on the batch's connection, sent with the last step's COMMIT."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta

from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.jobs import RoundRobin
from libs.common.core.settings import FollowupSettings
from libs.common.followups.release import Chain, release_one, seconds_until_next_due
from libs.common.followups.release_step import Released

__all__ = ["release_batch", "release_one", "seconds_until_next_due"]

#: The most steps of one project a turn releases: the projects are then walked again, so a step that fell
#: due meanwhile in another project waits at most about a turn's steps (tens of milliseconds), not a
#: backlog's share of a large batch. The walk costs two index descents per project with active
#: enrollments.
TURN = 16


def release_batch(
    pool: ConnectionPool,
    clock: Clock,
    settings: FollowupSettings,
    limit: int = 100,
    *,
    ai_lease: timedelta | None = None,
    on_lease: Callable[[Released], None] | None = None,
    turns: RoundRobin | None = None,
) -> int:
    """Release due enrollments one transaction at a time, up to ``limit``, in turns across projects (from
    where ``turns``, the loop's own, stopped; a new one starts from the first project); returns how many
    were handled. ``on_lease`` hears of each AI step leased (after its commit)."""
    turns = turns if turns is not None else RoundRobin()
    handled = 0
    # one connection for the batch, a transaction per step on it; each step's COMMIT travels with the next
    # step's claim, or the next walk of the projects (Chain): one round trip a step
    with pool.connection() as conn, Chain(conn, clock, settings, ai_lease) as chain:
        while handled < limit:
            projects = chain.due_projects(after=turns.after, projects=limit - handled)
            walked = handled
            for served, project_id in enumerate(projects, start=1):
                # an even share of what is left of the batch (what a project with fewer due steps leaves
                # goes to the ones after it); a turn gives each project a share at most, then the projects
                # are walked again, so a project whose step fell due meanwhile waits a turn at most
                share = min(TURN, math.ceil((limit - handled) / (len(projects) - served + 1)))
                for _ in range(share):
                    released = chain.release(project_id)
                    _leased(chain, on_lease)
                    if released is None:
                        break  # none of the project's due enrollments is left (or free)
                    handled += 1
            turns.served(projects)
            if handled == walked:
                break  # nothing was due (or free) in this walk
    _leased(chain, on_lease)
    return handled


def _leased(chain: Chain, on_lease: Callable[[Released], None] | None) -> None:
    """Each AI step the chain committed as leased, handed to ``on_lease`` (the model is called after)."""
    for released in chain.take_committed():
        if released.action == "lease" and on_lease is not None:
            on_lease(released)
