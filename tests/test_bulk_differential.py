"""A bulk job enrolls a chunk in a few statements (``enroll_all``); this test holds it to ``enroll()`` one
contact at a time, each in a savepoint (what the job did before), over generated populations.

Each example builds the same population in two new projects: contacts fresh, opted out, erased, live in the
sequence, or enrolled in it before (finished), some of them tagged ``unsubscribed``, which an exit of the
sequence that blocks entry refuses (or no such exit); a list of them with repeats and unknown ids; a re-entry
policy; a plan limit that the list reaches part-way (or none); a shared anchor for an anchor-timed step (or
none); a chunk size. One project's list goes through a bulk job (``process_chunk`` until it is done), the
other's through ``enroll()`` one by one. Both must give each listed contact the same outcome and skip reason,
leave the same enrollments (by contact: status, reason, source, variables, anchor, due time, step) and a live
count equal to a ``count(*)``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, cast

import psycopg
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.errors import FollowupsError, NotFound
from libs.common.core.jobs import savepoint
from libs.common.followups.definition import Definition, Exit, MessageStep
from libs.common.followups.enrollments import (
    EnrollmentRejected,
    EnrollRequest,
    ExitCriteriaMet,
    enroll,
    enroll_all,
    stop_enrollment,
)
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.followups.transitions import Enrollment
from libs.common.platform.projects import create_project
from libs.common.rules import bulk
from libs.common.rules.bulk import BulkCreate
from tests.condition_helpers import POOL_THREADS_USE_RANDOM, QUICK
from tests.conftest import Project
from tests.factories import make_contact, make_sequence

Kind = Literal["fresh", "opted_out", "erased", "live", "finished"]
Policy = Literal["after_finished", "never", "always"]
VARIABLES = {"first_name": "Ana", "offer": {"pct": 15}}
#: An exit that refuses to enroll a contact tagged ``unsubscribed``.
BLOCKING = Exit(
    name="unsubscribed",
    event="contact.tag_added",
    conditions={"attribute": "contact.tags", "operator": "contains", "value": "unsubscribed"},
    blocks_entry=True,
)


@dataclass(frozen=True)
class Population:
    kinds: list[Kind]
    #: The list: an index into ``kinds``, or None for an id no contact has.
    listed: list[int | None]
    policy: Policy
    #: Live enrollments the plan allows beyond those of the population (None: no limit).
    room: int | None
    anchored: bool
    chunk: int
    #: Whether the sequence has an exit that blocks entry (tagged ``unsubscribed``), and who is tagged so.
    blocking: bool = False
    tagged: frozenset[int] = frozenset()


@st.composite
def populations(draw: st.DrawFn) -> Population:
    kinds: list[Kind] = draw(
        st.lists(
            st.sampled_from(["fresh", "fresh", "opted_out", "erased", "live", "finished"]),
            min_size=1,
            max_size=14,
        )
    )
    index = st.integers(0, len(kinds) - 1)
    listed = draw(st.lists(st.one_of(index, index, index, st.none()), min_size=1, max_size=30))
    return Population(
        kinds=kinds,
        listed=listed,
        policy=draw(st.sampled_from(["after_finished", "never", "always"])),
        room=draw(st.one_of(st.none(), st.integers(0, 5), st.integers(0, 5))),
        anchored=draw(st.booleans()),
        chunk=draw(st.one_of(st.integers(1, 5), st.integers(6, 40))),
        blocking=draw(st.booleans()),
        tagged=frozenset(draw(st.sets(index, max_size=len(kinds)))),
    )


@dataclass
class Built:
    project_id: uuid.UUID
    sequence_id: uuid.UUID
    contacts: list[uuid.UUID]


def build(pool: ConnectionPool, clock: ManualClock, population: Population) -> Built:
    """The population in a project of its own."""
    with pool.connection() as conn:
        project_id = create_project(conn, f"differential {uuid.uuid4().hex[:6]}").project_id
    step = (
        MessageStep(text="Hi {{vars.first_name}}", anchor_offset_seconds=3600)
        if population.anchored
        else (MessageStep(text="Hi {{vars.first_name}}", delay_seconds=3600))
    )
    with pool.connection() as conn:
        sequence = create_sequence(
            conn,
            project_id,
            SequenceCreate(
                name="differential",
                definition=Definition(
                    steps=[step], reentry=population.policy, exits=[BLOCKING] if population.blocking else []
                ),
            ),
        )
        publish_sequence(conn, project_id, sequence.id)
    contacts = [make_contact(pool, project_id) for _ in population.kinds]
    with pool.connection() as conn:
        for contact_id, kind in zip(contacts, population.kinds, strict=True):
            if kind in ("live", "finished"):
                request = EnrollRequest(sequence_id=sequence.id, contact_id=contact_id)
                enrollment, _ = enroll(conn, project_id, request, now=clock.now() - timedelta(days=1))
                if kind == "finished":
                    stop_enrollment(
                        conn, project_id, enrollment.id, note=None, now=clock.now() - timedelta(hours=1)
                    )
            elif kind == "opted_out":
                conn.execute("UPDATE contacts SET opted_out_at = %s WHERE id = %s", (clock.now(), contact_id))
            elif kind == "erased":
                conn.execute("UPDATE contacts SET erased_at = %s WHERE id = %s", (clock.now(), contact_id))
        for n in population.tagged:  # once enrolled (the exit would refuse the live and finished ones)
            conn.execute("UPDATE contacts SET tags = ARRAY['unsubscribed'] WHERE id = %s", (contacts[n],))
        if population.room is not None:
            live = population.kinds.count("live")
            conn.execute(
                "UPDATE projects SET max_active_enrollments = %s WHERE id = %s",
                (live + population.room, project_id),
            )
    return Built(project_id, sequence.id, contacts)


def listed_ids(built: Built, population: Population, unknown: list[uuid.UUID]) -> list[uuid.UUID]:
    return [built.contacts[i] if i is not None else unknown[n] for n, i in enumerate(population.listed)]


def anchor(population: Population, clock: ManualClock) -> datetime | None:
    return clock.now() + timedelta(days=2) if population.anchored else None


def by_job(
    pool: ConnectionPool, clock: ManualClock, built: Built, ids: list[uuid.UUID], population: Population
) -> list[tuple[Any, ...]]:
    """The list through a bulk job: each contact's (outcome, reason), in order."""
    with pool.connection() as conn:
        job, _ = bulk.create_job(
            conn,
            built.project_id,
            BulkCreate(
                sequence_id=built.sequence_id,
                contact_ids=ids,
                variables=VARIABLES,
                anchor_at=anchor(population, clock),
            ),
            now=clock.now(),
        )
    for _ in range(1000):
        if not bulk.process_chunk(pool, clock, chunk=population.chunk):
            with pool.connection() as conn:
                row = conn.execute(
                    "SELECT status FROM followup_bulk_jobs WHERE id = %s", (job.id,)
                ).fetchone()
            assert row is not None
            if row[0] == "completed":
                break
    with pool.connection() as conn:
        return [(o, r) for *_, o, r in bulk.item_outcomes(conn, built.project_id, job.id)]


def one_by_one(
    pool: ConnectionPool, clock: ManualClock, built: Built, ids: list[uuid.UUID], population: Population
) -> list[tuple[Any, ...]]:
    """The list through ``enroll()``, a contact at a time in a savepoint, the refusals read as a bulk job's
    skip reasons (docs/api.md): each contact's (outcome, reason), in order."""
    found: list[tuple[Any, ...]] = []
    with pool.connection() as conn:
        for contact_id in ids:
            request = EnrollRequest(
                sequence_id=built.sequence_id,
                contact_id=contact_id,
                variables=VARIABLES,
                anchor_at=anchor(population, clock),
            )
            try:
                with savepoint(conn):
                    enroll(conn, built.project_id, request, now=clock.now(), source="bulk")
                found.append(("enrolled", None))
            except ExitCriteriaMet as refusal:
                found.append(("skipped", f"{refusal.code}:{refusal.detail}"))
            except EnrollmentRejected as refusal:
                found.append(("skipped", refusal.code))
            except NotFound:
                found.append(("skipped", "unknown_contact"))
            except FollowupsError:
                found.append(("skipped", "invalid"))
            except (OverflowError, ValueError, psycopg.DataError):
                found.append(("skipped", "error"))
    return found


def enrollments(conn: Connection[Any], built: Built) -> list[list[tuple[Any, ...]]]:
    """Each contact's enrollments in the sequence (by the contact's place in the population), compared."""
    found = []
    for contact_id in built.contacts:
        rows = conn.execute(
            "SELECT status, reason, source, variables, anchor_at, next_run_at, step_index"
            " FROM followup_enrollments"
            " WHERE project_id = %s AND sequence_id = %s AND contact_id = %s ORDER BY enrolled_at, status",
            (built.project_id, built.sequence_id, contact_id),
        ).fetchall()
        found.append(rows)
    return found


def live_count(conn: Connection[Any], project_id: uuid.UUID) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT coalesce(sum(live), 0) FROM followup_live_counters WHERE project_id = %(p)s),"
        " (SELECT count(*) FROM followup_enrollments"
        "  WHERE project_id = %(p)s AND status IN ('active', 'paused'))",
        {"p": project_id},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.timeout(600)
@POOL_THREADS_USE_RANDOM
@settings(QUICK, max_examples=40, phases=[Phase.explicit, Phase.generate])
@given(population=populations())
def test_a_bulk_job_enrolls_as_enroll_one_by_one(
    pool: ConnectionPool, clock: ManualClock, population: Population
) -> None:
    unknown = [uuid.uuid4() for _ in population.listed]
    jobbed, single = build(pool, clock, population), build(pool, clock, population)

    by_bulk = by_job(pool, clock, jobbed, listed_ids(jobbed, population, unknown), population)
    by_enroll = one_by_one(pool, clock, single, listed_ids(single, population, unknown), population)

    assert by_bulk == by_enroll, population
    with pool.connection() as conn:
        assert enrollments(conn, jobbed) == enrollments(conn, single), population
        for built in (jobbed, single):
            counted, live = live_count(conn, built.project_id)
            assert counted == live, population
            if population.room is not None:
                assert live <= population.kinds.count("live") + population.room


def test_the_differential_test_sees_a_plan_limit_reached_mid_chunk(
    pool: ConnectionPool, clock: ManualClock
) -> None:
    """An example spelled out: a plan with room for two more, one chunk of fresh contacts, one live and a
    repeat; the first two fresh enrolled, the live one already enrolled while there is room, then each
    refused for the plan (the repeat too: the limit is checked before the live enrollment), both ways."""
    population = Population(
        kinds=["fresh", "live", "fresh", "fresh", "fresh"],
        listed=[0, 1, 2, 3, 0, 4],
        policy="after_finished",
        room=2,
        anchored=False,
        chunk=10,
    )
    unknown = [uuid.uuid4() for _ in population.listed]
    jobbed, single = build(pool, clock, population), build(pool, clock, population)
    by_bulk = by_job(pool, clock, jobbed, listed_ids(jobbed, population, unknown), population)
    by_enroll = one_by_one(pool, clock, single, listed_ids(single, population, unknown), population)
    expected = [
        ("enrolled", None),
        ("skipped", "already_enrolled"),
        ("enrolled", None),
        ("skipped", "plan_limit"),
        ("skipped", "plan_limit"),
        ("skipped", "plan_limit"),
    ]
    assert by_bulk == by_enroll == expected


def test_the_differential_test_sees_an_exit_that_blocks_entry(
    pool: ConnectionPool, clock: ManualClock
) -> None:
    """An example spelled out: the tagged contacts (fresh, live and finished) refused for the exit, before the
    re-entry policy would replace the live one; the untagged one enrolled, both ways."""
    population = Population(
        kinds=["fresh", "fresh", "live", "finished"],
        listed=[0, 1, 2, 3],
        policy="always",
        room=None,
        anchored=False,
        chunk=10,
        blocking=True,
        tagged=frozenset({0, 2, 3}),
    )
    unknown = [uuid.uuid4() for _ in population.listed]
    jobbed, single = build(pool, clock, population), build(pool, clock, population)
    by_bulk = by_job(pool, clock, jobbed, listed_ids(jobbed, population, unknown), population)
    by_enroll = one_by_one(pool, clock, single, listed_ids(single, population, unknown), population)
    refused = ("skipped", "exit_criteria:unsubscribed")
    assert by_bulk == by_enroll == [refused, ("enrolled", None), refused, refused]


def test_enroll_all_applies_dedupe_keys_as_enroll_one_by_one(
    pool: ConnectionPool, clock: ManualClock, project: Project, other_project: Project
) -> None:
    """A bulk job carries no dedupe key; enroll_all does (the API's enroll() is its case of one): a key
    known before, a key listed twice, a contact listed twice under two keys, the same both ways."""
    results = []
    for target in (project, other_project):
        sequence_id = make_sequence(pool, target.id, MessageStep(text="Hi", delay_seconds=3600))
        contacts = [make_contact(pool, target.id) for _ in range(3)]
        with pool.connection() as conn:
            enroll(
                conn,
                target.id,
                EnrollRequest(sequence_id=sequence_id, contact_id=contacts[2], dedupe_key="known"),
                now=clock.now(),
            )
        requests = [
            EnrollRequest(sequence_id=sequence_id, contact_id=contacts[0], dedupe_key="a"),
            EnrollRequest(sequence_id=sequence_id, contact_id=contacts[1], dedupe_key="a"),
            EnrollRequest(sequence_id=sequence_id, contact_id=contacts[1], dedupe_key="known"),
            EnrollRequest(sequence_id=sequence_id, contact_id=contacts[1], dedupe_key="b"),
            EnrollRequest(sequence_id=sequence_id, contact_id=contacts[1], dedupe_key="c"),
        ]
        with pool.connection() as conn:
            if target is project:
                found = enroll_all(conn, target.id, requests, now=clock.now())
            else:
                found = []
                for request in requests:
                    try:
                        with savepoint(conn):
                            found.append(enroll(conn, target.id, request, now=clock.now()))
                    except FollowupsError as refusal:
                        found.append(refusal)
        by_contact = {c: n for n, c in enumerate(contacts)}
        results.append(
            [
                (type(r).__name__,)
                if isinstance(r, Exception)
                else (by_contact[r[0].contact_id], cast(Enrollment, r[0]).dedupe_key, r[1])
                for r in found
            ]
        )
    assert (
        results[0]
        == results[1]
        == [
            (0, "a", True),
            (0, "a", False),
            (2, "known", False),
            (1, "b", True),
            ("AlreadyEnrolled",),
        ]
    )
