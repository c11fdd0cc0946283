"""A split's assignment (graph.assign): shares that follow the weights over 10,000 contacts, the same arm
for a contact in every version of the sequence, and no correlation between two experiments.

The contacts' ids are drawn from a seeded generator, so each run is the same; the bounds are chosen so
that a correct assignment (a point spread uniformly over [0, 1), as a hash's is) would fail them for at
most about one seed in a billion:

- the shares: Pearson's chi-square of the counts against the weights' shares, refused when its p-value is
  below 1e-9; and each arm's count within 6.5 binomial standard deviations of its expectation (a normal
  tail of 8e-11 per arm). Over 10,000 contacts, 6.5 deviations of a 45 % arm are 3.2 points: a weight read
  wrong (the holdout left out of the total moves the first arm 4.5 points) fails it;
- independence: the chi-square of the two experiments' contingency table (expected counts from its
  margins) with a p-value above 1e-9, and each cell of two 50/50 experiments within 6.5 deviations of a
  quarter.
"""

from __future__ import annotations

import math
import random
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import msgspec
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.followups import graph
from libs.common.followups.definition import Definition, MessageStep, Node, SplitStep, Variant
from libs.common.followups.sequences import (
    SequenceCreate,
    SequenceUpdate,
    create_sequence,
    publish_sequence,
    update_sequence,
    version_definition,
)
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment
from tests.helpers import rows
from tests.release_helpers import release_all

CONTACTS = 10_000
#: The smallest p-value a correct assignment is allowed (its false-failure rate).
ALPHA = 1e-9
#: Binomial standard deviations an arm's count may stray (two-sided normal tail 8e-11).
DEVIATIONS = 6.5


def contacts(count: int = CONTACTS, seed: int = 28) -> list[uuid.UUID]:
    draw = random.Random(seed)
    return [uuid.UUID(int=draw.getrandbits(128), version=4) for _ in range(count)]


def chi_square_sf(statistic: float, df: int) -> float:
    """P(X >= statistic) for X chi-square with ``df`` degrees of freedom (closed forms for an integer df)."""
    half = statistic / 2
    if df % 2 == 0:
        return math.exp(-half) * sum(half**i / math.factorial(i) for i in range(df // 2))
    tail = math.erfc(math.sqrt(half))
    return tail + math.exp(-half) * sum(
        math.pow(half, i - 0.5) / math.gamma(i + 0.5) for i in range(1, df // 2 + 1)
    )


def test_the_chi_square_tail_is_the_tables() -> None:
    # the 5 % and 0.1 % critical values of the tables, for 1, 3 and 9 degrees of freedom
    for statistic, df, p in [(3.841, 1, 0.05), (7.815, 3, 0.05), (16.266, 3, 0.001), (16.919, 9, 0.05)]:
        assert math.isclose(chi_square_sf(statistic, df), p, rel_tol=2e-3), (statistic, df)
    assert math.isclose(chi_square_sf(5.991, 2), 0.05, rel_tol=2e-3)


def split(
    experiment: str, weights: list[int], holdout: int, *, to: str = "end", id: str | None = None
) -> SplitStep:
    return SplitStep(
        id=id,
        experiment=experiment,
        variants=[Variant(name=f"v{i}", weight=w, to=to) for i, w in enumerate(weights)],
        holdout_weight=holdout,
    )


def arms(definition: Definition, index: int, sequence_id: uuid.UUID, ids: list[uuid.UUID]) -> list[str]:
    return [graph.assign(definition, index, sequence_id, c).variant for c in ids]


def test_shares_follow_the_weights_and_the_holdout_over_10000_contacts() -> None:
    """50/30/20 with a holdout of 10: 50/110, 30/110, 20/110 and 10/110 of the contacts."""
    definition = Definition(steps=[split("offer", [50, 30, 20], 10, to="x"), MessageStep(id="x", text="x")])
    sequence_id = uuid.UUID("6f1c1a52-3d4e-4c7b-9a55-2b8f0e6d9c01")
    assigned = [graph.assign(definition, 0, sequence_id, c) for c in contacts()]
    counts = Counter(a.variant for a in assigned)
    shares = {"v0": 50 / 110, "v1": 30 / 110, "v2": 20 / 110, graph.HOLDOUT: 10 / 110}

    assert set(counts) == set(shares)
    statistic = sum((counts[arm] - CONTACTS * p) ** 2 / (CONTACTS * p) for arm, p in shares.items())
    assert chi_square_sf(statistic, len(shares) - 1) > ALPHA, (counts, statistic)
    for arm, p in shares.items():
        bound = DEVIATIONS * math.sqrt(CONTACTS * p * (1 - p))
        assert abs(counts[arm] - CONTACTS * p) <= bound, (arm, counts)
    # a variant goes where it says, the holdout nowhere
    assert {(a.variant, a.target) for a in assigned} == {
        ("v0", 1),
        ("v1", 1),
        ("v2", 1),
        (graph.HOLDOUT, graph.END),
    }


def test_a_winner_takes_everyone() -> None:
    definition = Definition(steps=[msgspec.structs.replace(split("offer", [50, 30, 20], 10), winner="v2")])
    assert set(arms(definition, 0, uuid.uuid4(), contacts(500))) == {"v2"}
    # the winner the sequence chose later (graph.assign's ``winner``) overrides the definition's
    assert {graph.assign(definition, 0, None, c, winner="v1").variant for c in contacts(500)} == {"v1"}


def test_a_winner_chosen_that_is_no_longer_a_variant_leaves_the_splits_own_winner_or_the_weights() -> None:
    """A winner chosen on an earlier version (graph.assign's ``winner``) whose variant this version no
    longer has: the split's own winner, when it has one, else the weights (not nobody's winner)."""
    own = Definition(steps=[msgspec.structs.replace(split("offer", [1, 1], 0), winner="v1")])
    assert {graph.assign(own, 0, None, c, winner="gone").variant for c in contacts(200)} == {"v1"}
    weighed = Definition(steps=[split("offer", [1, 1], 0)])
    assert {graph.assign(weighed, 0, None, c, winner="gone").variant for c in contacts(200)} == {"v0", "v1"}


def _publish(pool: ConnectionPool, project: Project, sequence_id: uuid.UUID, *steps: Node) -> Definition:
    """A new version of the sequence with ``steps``, read back as the release reads it."""
    with pool.connection() as conn:
        update_sequence(
            conn, project.id, sequence_id, SequenceUpdate(definition=Definition(steps=list(steps)))
        )
        version, new = publish_sequence(conn, project.id, sequence_id)
        assert new
        return version_definition(conn, project.id, version.id)


def test_a_contact_keeps_its_arm_across_versions_and_a_changed_weight_moves_only_the_boundary(
    pool: ConnectionPool, project: Project
) -> None:
    """Version 2 moves the split (a step before it), renames nothing: every contact keeps its arm. Version
    3 gives v0 60 of 100 instead of 50: only contacts of v1 whose point lies in [0.5, 0.6) move, to v0."""
    with pool.connection() as conn:
        sequence_id = create_sequence(conn, project.id, SequenceCreate(name="experiment")).id
    ids = contacts(4000)
    first = _publish(
        pool, project, sequence_id, split("offer", [50, 50], 0, to="x"), MessageStep(id="x", text="x")
    )
    second = _publish(
        pool,
        project,
        sequence_id,
        MessageStep(id="hello", text="hello"),
        split("offer", [50, 50], 0, to="x"),
        MessageStep(id="x", text="another text"),
    )
    third = _publish(
        pool, project, sequence_id, split("offer", [60, 40], 0, to="x"), MessageStep(id="x", text="x")
    )

    before = arms(first, 0, sequence_id, ids)
    assert arms(second, 1, sequence_id, ids) == before
    after = arms(third, 0, sequence_id, ids)
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert set(moved) == {("v1", "v0")}
    expected, deviation = len(ids) * 0.1, math.sqrt(len(ids) * 0.1 * 0.9)
    assert abs(len(moved) - expected) <= DEVIATIONS * deviation, len(moved)

    # another sequence's experiment of the same name is another draw: about half agree
    other = arms(first, 0, uuid.uuid4(), ids)
    agree = sum(a == b for a, b in zip(before, other, strict=True))
    assert abs(agree - len(ids) / 2) <= DEVIATIONS * math.sqrt(len(ids) / 4), agree


def test_two_experiments_assign_independently() -> None:
    """Two splits of one sequence: a contact's arm in one tells nothing of its arm in the other."""
    definition = Definition(
        steps=[
            split("first", [50, 30, 20], 10, to="second"),
            split("second", [50, 30, 20], 10, id="second"),
        ]
    )
    sequence_id, ids = uuid.uuid4(), contacts()
    table = Counter(
        zip(arms(definition, 0, sequence_id, ids), arms(definition, 1, sequence_id, ids), strict=True)
    )
    rows = Counter(r for r, _ in table.elements())
    columns = Counter(c for _, c in table.elements())
    statistic = sum(
        (table[(r, c)] - rows[r] * columns[c] / CONTACTS) ** 2 / (rows[r] * columns[c] / CONTACTS)
        for r in rows
        for c in columns
    )
    assert chi_square_sf(statistic, (len(rows) - 1) * (len(columns) - 1)) > ALPHA, table

    # two 50/50 experiments: each of the four cells near a quarter
    halves = Definition(steps=[split("a", [1, 1], 0, to="b"), split("b", [1, 1], 0, id="b")])
    cells = Counter(zip(arms(halves, 0, sequence_id, ids), arms(halves, 1, sequence_id, ids), strict=True))
    assert len(cells) == 4
    for cell, count in cells.items():
        assert abs(count - CONTACTS / 4) <= DEVIATIONS * math.sqrt(CONTACTS * 0.25 * 0.75), (cell, cells)


def test_a_contact_enrolled_again_on_a_new_version_gets_the_same_variant_at_release(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    """The release's assignment, end to end: 60 contacts (every arm drawn but once in 10**7) go through
    version 1's split; version 2 moves the split behind a new first step and rewords the variants'
    messages; each contact, enrolled again, is recorded with the same arm (the holdout's too)."""
    three = split("offer", [1, 1, 1], 1, to="x")
    with pool.connection() as conn:
        sequence_id = create_sequence(conn, project.id, SequenceCreate(name="experiment")).id
    _publish(pool, project, sequence_id, three, MessageStep(id="x", text="x"))
    ids = [make_contact(pool, project.id) for _ in range(60)]

    def enroll_and_release() -> dict[uuid.UUID, Any]:
        for contact_id in ids:
            make_enrollment(pool, clock, project.id, sequence_id, contact_id)
        while release_all(pool, clock):
            clock.advance(timedelta(minutes=1))
        clock.advance(timedelta(hours=1))
        found = rows(
            pool,
            "SELECT DISTINCT ON (contact_id) contact_id, status, assignments FROM followup_enrollments"
            " WHERE project_id = %s AND sequence_id = %s ORDER BY contact_id, enrolled_at DESC",
            project.id,
            sequence_id,
        )
        assert {status for _, status, _ in found} == {"completed"}
        return {contact_id: assignments for contact_id, _, assignments in found}

    first = enroll_and_release()
    assert {a["offer"] for a in first.values()} == {"v0", "v1", "v2", graph.HOLDOUT}
    _publish(
        pool,
        project,
        sequence_id,
        MessageStep(id="hello", text="hello"),
        three,
        MessageStep(id="x", text="y"),
    )
    assert enroll_and_release() == first
