"""The release takes turns across projects: a batch walks the projects with due steps from where the loop's
previous batch stopped and releases an even share of each (a turn), then walks them again, every claim naming
its project, so one project's backlog never delays another project's due step by more than a turn."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.jobs import RoundRobin
from libs.common.followups import release_claim
from libs.common.followups.definition import MessageStep
from libs.common.followups.release import Chain
from libs.common.platform.projects import create_project
from services.release.release import TURN, release_batch, release_one
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows
from tests.release_helpers import SETTINGS


def _projects(pool: ConnectionPool, count: int) -> list[uuid.UUID]:
    with pool.connection() as conn:
        return sorted(create_project(conn, f"project {i}").project_id for i in range(count))


def _enroll(
    pool: ConnectionPool, clock: ManualClock, project_id: uuid.UUID, count: int, delay: int = 0
) -> None:
    sequence = make_sequence(pool, project_id, MessageStep(text="hello", delay_seconds=delay))
    for _ in range(count):
        make_enrollment(pool, clock, project_id, sequence, make_contact(pool, project_id))


def _released(pool: ConnectionPool) -> dict[uuid.UUID, int]:
    return dict(rows(pool, "SELECT project_id, count(*) FROM followup_step_runs GROUP BY project_id"))


def test_a_big_backlog_keeps_no_other_projects_step_out_of_the_first_turn(
    pool: ConnectionPool, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given one project with 60 due steps and three with one each
    big, *small = _projects(pool, 4)
    _enroll(pool, clock, big, 60)
    for project_id in small:
        _enroll(pool, clock, project_id, 1)
    released_before: list[dict[uuid.UUID, int]] = []  # at each walk of the projects: each one's steps so far
    steps: dict[uuid.UUID, int] = {}
    walk, release = Chain.due_projects, Chain.release

    def walked(chain: Chain, **kwargs: Any) -> list[uuid.UUID]:
        released_before.append(dict(steps))
        return walk(chain, **kwargs)

    def released_one(chain: Chain, project_id: uuid.UUID) -> Any:
        done = release(chain, project_id)
        if done is not None:
            steps[project_id] = steps.get(project_id, 0) + 1
        return done

    monkeypatch.setattr(Chain, "due_projects", walked)
    monkeypatch.setattr(Chain, "release", released_one)
    # When one batch of 12 is released: the first turn gives the big project a quarter of it (3) and each
    # small project its step, the second turn (the projects walked again) gives the big one what is left
    assert release_batch(pool, clock, SETTINGS, limit=12) == 12
    assert released_before[:2] == [{}, {big: 3, **dict.fromkeys(small, 1)}]
    released = _released(pool)
    assert {project_id: released.get(project_id) for project_id in small} == dict.fromkeys(small, 1)
    assert released[big] == 9
    # and a turn is at most TURN steps a project, so that the next walk comes soon: the 51 left take four
    # turns (then a walk that finds nothing)
    released_before.clear()
    assert release_batch(pool, clock, SETTINGS, limit=100) == 51
    assert [counts[big] for counts in released_before] == [9, 9 + TURN, 9 + 2 * TURN, 9 + 3 * TURN, 60]


def test_turns_go_round_from_where_the_last_batch_stopped(pool: ConnectionPool, clock: ManualClock) -> None:
    # Given three projects with 4 due steps each
    projects = _projects(pool, 3)
    for project_id in projects:
        _enroll(pool, clock, project_id, 4)
    turns = RoundRobin()
    # When batches of 2 are released with the loop's turns (an even share: one step per project, 2 projects)
    for _ in range(3):
        assert release_batch(pool, clock, SETTINGS, limit=2, turns=turns) == 2
    # Then each project was served twice: the walk went on after the last project served, wrapping around
    assert _released(pool) == dict.fromkeys(projects, 2)


def test_the_walk_wraps_around_and_passes_over_projects_with_nothing_due(
    pool: ConnectionPool, clock: ManualClock
) -> None:
    first, second, third, fourth = _projects(pool, 4)
    for project_id in (first, third, fourth):
        _enroll(pool, clock, project_id, 1)
    _enroll(pool, clock, second, 5, delay=3600)  # active, not due: walked past, never served
    with pool.connection() as conn:
        now = clock.now()
        assert release_claim.due_projects(conn, now, after=uuid.UUID(int=0), projects=10) == [
            first,
            third,
            fourth,
        ]
        assert release_claim.due_projects(conn, now, after=third, projects=10) == [fourth, first, third]
        assert release_claim.due_projects(conn, now, after=second, projects=2) == [third, fourth]
        assert release_claim.due_projects(conn, now, after=fourth, projects=10) == [first, third, fourth]
        clock.advance(timedelta(hours=2))
        assert release_claim.due_projects(conn, clock.now(), after=first, projects=10) == [
            second,
            third,
            fourth,
            first,
        ]


def test_a_claim_takes_only_its_projects_step(pool: ConnectionPool, clock: ManualClock) -> None:
    mine, theirs = _projects(pool, 2)
    _enroll(pool, clock, theirs, 1)
    # Given only another project has a due step, a claim in this one finds nothing
    assert release_one(pool, clock, SETTINGS, project_id=mine) is None
    _enroll(pool, clock, mine, 1)
    assert release_one(pool, clock, SETTINGS, project_id=mine) is not None
    assert _released(pool) == {mine: 1}
