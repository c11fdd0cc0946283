"""The job runner and its backoff policy, against real PostgreSQL: a tiny queue over a table of its own.

An item's error, a Python one or a statement-level one (a constraint violation), backs off that item only:
the other items of the batch are done, in their own transactions or in savepoints of one; after its last
attempt an item is given up; a refusal is an outcome; a failure that cannot be written is logged and the
batch goes on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.errors import Conflict
from libs.common.core.jobs import (
    OLDEST_FIRST,
    STANDARD_BACKOFF,
    Backoff,
    Failed,
    Failure,
    Fairness,
    Queue,
    Retry,
    RoundRobin,
    run_batch,
    savepoint,
)
from libs.common.core.runtime import Runtime
from libs.common.rules import triggers
from tests.factories import new_phone
from tests.helpers import rows
from tests.rule_helpers import add_tag, create_rule

#: The tiny queue's retry: 10 s, doubling, at most 40 s; given up after the third attempt.
RETRY = Retry(max_attempts=3, backoff=Backoff(first=timedelta(seconds=10), most=timedelta(seconds=40)))

TABLE = """
CREATE TABLE tiny_jobs (
    id int PRIMARY KEY,
    due_at timestamptz NOT NULL,
    status text NOT NULL DEFAULT 'pending',
    attempts int NOT NULL DEFAULT 0,
    result int CHECK (result IS NULL OR result > 0),
    last_error text
)
"""


class Tiny(Queue[tuple[int, int], Connection[Any]]):
    """Items (id, attempts): id 2 raises a Python error, id 3 violates the CHECK constraint, id 4 is refused,
    id 5 fails after keeping its work; the others are done."""

    retry = RETRY
    refusals = (Conflict,)

    def __init__(self, pool: ConnectionPool, clock: ManualClock) -> None:
        self.pool = pool
        self.clock = clock
        self.claims: list[Fairness] = []

    def claim(self, limit: int, fairness: Fairness) -> list[tuple[int, int]]:
        self.claims.append(fairness)
        with self.pool.connection() as conn:
            query = (
                "SELECT id, attempts FROM tiny_jobs WHERE status = 'pending' AND due_at <= %s"
                " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
            )
            return [(i, a) for i, a in conn.execute(query, (self.clock.now(), limit)).fetchall()]

    def isolate(self) -> AbstractContextManager[Connection[Any]]:
        return self.pool.connection()

    def run(self, ctx: Connection[Any], item: tuple[int, int]) -> Failed | None:
        job_id, _ = item
        if job_id == 2:
            raise RuntimeError("the job broke")
        if job_id == 4:
            ctx.execute("UPDATE tiny_jobs SET result = 99 WHERE id = %s", (job_id,))  # rolled back
            raise Conflict("not now")
        result = -1 if job_id == 3 else job_id
        ctx.execute("UPDATE tiny_jobs SET result = %s WHERE id = %s", (result, job_id))
        if job_id == 5:
            return Failed("half done")
        ctx.execute("UPDATE tiny_jobs SET status = 'done' WHERE id = %s", (job_id,))
        return None

    def refused(self, ctx: Connection[Any], item: tuple[int, int], refusal: Exception) -> None:
        ctx.execute("UPDATE tiny_jobs SET status = 'refused' WHERE id = %s", (item[0],))

    def attempt(self, item: tuple[int, int]) -> int:
        return item[1] + 1

    def record(self, ctx: Connection[Any], item: tuple[int, int], failure: Failure) -> bool:
        params = {
            "id": item[0],
            "error": repr(failure.error),
            "due_at": failure.retry_at(self.clock.now()),
            "given_up": failure.given_up,
        }
        ctx.execute(
            "UPDATE tiny_jobs SET attempts = attempts + 1, last_error = %(error)s, due_at = %(due_at)s,"
            " status = CASE WHEN %(given_up)s THEN 'failed' ELSE status END WHERE id = %(id)s",
            params,
        )
        return True

    def describe(self, item: tuple[int, int]) -> dict[str, Any]:
        return {"job_id": item[0]}


@pytest.fixture
def tiny(pool: ConnectionPool, clock: ManualClock) -> Iterator[Tiny]:
    with pool.connection() as conn:
        conn.execute(TABLE)
        conn.execute(
            "INSERT INTO tiny_jobs (id, due_at) SELECT i, %s FROM generate_series(1, 6) AS i", (clock.now(),)
        )
    yield Tiny(pool, clock)


def jobs(pool: ConnectionPool) -> dict[int, tuple[str, int, int | None]]:
    found = rows(pool, "SELECT id, status, attempts, result FROM tiny_jobs ORDER BY id")
    return {job_id: (status, attempts, result) for job_id, status, attempts, result in found}


def due(pool: ConnectionPool, job_id: int) -> datetime:
    [(at,)] = rows(pool, "SELECT due_at FROM tiny_jobs WHERE id = %s", job_id)
    assert isinstance(at, datetime)
    return at


def test_a_python_error_and_a_statement_error_back_off_their_item_only(
    tiny: Tiny, pool: ConnectionPool, clock: ManualClock
) -> None:
    start = clock.now()

    ran = run_batch(tiny, limit=100)

    assert (ran.claimed, ran.done, ran.refused, ran.retried, ran.given_up, ran.lost) == (6, 2, 1, 3, 0, 0)
    assert jobs(pool) == {
        1: ("done", 0, 1),
        2: ("pending", 1, None),  # the Python error: backed off
        3: ("pending", 1, None),  # the CHECK violation: its statement rolled back, backed off
        4: ("refused", 0, None),  # an outcome: its work rolled back, not a failure
        5: ("pending", 1, 5),  # failed, but the work it kept is committed with the failure
        6: ("done", 0, 6),
    }
    assert [due(pool, i) - start for i in (2, 3, 5)] == [timedelta(seconds=10)] * 3
    [(error,)] = rows(pool, "SELECT last_error FROM tiny_jobs WHERE id = 3")
    assert "CheckViolation" in error
    assert tiny.claims == [OLDEST_FIRST]  # the fairness seam: today every claim is oldest first


def test_an_item_that_keeps_failing_is_given_up_after_its_last_attempt(
    tiny: Tiny, pool: ConnectionPool, clock: ManualClock
) -> None:
    start = clock.now()
    run_batch(tiny, limit=100)

    # Then the failing items come back after 10 s, then 20 s; the third attempt gives them up
    assert run_batch(tiny, limit=100).claimed == 0  # not due before their backoff
    clock.advance(timedelta(seconds=10))
    second = run_batch(tiny, limit=100)
    assert (second.claimed, second.retried, second.given_up) == (3, 3, 0)
    assert [due(pool, i) - clock.now() for i in (2, 3, 5)] == [timedelta(seconds=20)] * 3
    clock.advance(timedelta(seconds=20))
    third = run_batch(tiny, limit=100)
    assert (third.claimed, third.retried, third.given_up) == (3, 0, 3)
    assert {i: jobs(pool)[i][:2] for i in (2, 3, 5)} == {2: ("failed", 3), 3: ("failed", 3), 5: ("failed", 3)}
    clock.advance(timedelta(days=1))
    assert run_batch(tiny, limit=100).claimed == 0  # given up: never claimed again
    assert clock.now() - start == timedelta(days=1, seconds=30)


def test_items_in_savepoints_of_one_transaction_never_abort_it(
    tiny: Tiny, pool: ConnectionPool, clock: ManualClock
) -> None:
    with pool.connection() as conn:

        class InOneTransaction(Tiny):
            def isolate(self) -> AbstractContextManager[Connection[Any]]:
                return savepoint(conn)

            def outside(self) -> AbstractContextManager[Connection[Any]]:
                return nullcontext(conn)

        ran = run_batch(InOneTransaction(pool, clock), limit=100)
        # the transaction is still usable after the CHECK violation of item 3
        conn.execute("UPDATE tiny_jobs SET last_error = 'batch committed' WHERE id = 1")

    assert (ran.done, ran.refused, ran.retried) == (2, 1, 3)
    assert jobs(pool) == {
        1: ("done", 0, 1),
        2: ("pending", 1, None),
        3: ("pending", 1, None),
        4: ("refused", 0, None),
        5: ("pending", 1, 5),
        6: ("done", 0, 6),
    }
    assert rows(pool, "SELECT last_error FROM tiny_jobs WHERE id = 1") == [("batch committed",)]


def test_a_failure_that_cannot_be_written_is_logged_and_the_batch_goes_on(
    tiny: Tiny, pool: ConnectionPool, caplog: pytest.LogCaptureFixture
) -> None:
    class Unwritable(Tiny):
        def record(self, ctx: Connection[Any], item: tuple[int, int], failure: Failure) -> bool:
            ctx.execute("SELECT 1 / 0")
            return True

    ran = run_batch(Unwritable(pool, tiny.clock), limit=100)

    assert (ran.done, ran.refused, ran.lost) == (2, 1, 3)
    # job 5's kept work rolled back with the failed write; job 3's statement rolled back
    assert {i: jobs(pool)[i] for i in (2, 3, 5)} == {i: ("pending", 0, None) for i in (2, 3, 5)}
    assert ran.unrecorded == [{"job_id": 2}, {"job_id": 3}, {"job_id": 5}]
    lost = [r for r in caplog.records if r.getMessage().startswith("job failure not recorded")]
    assert [getattr(r, "job_id", None) for r in lost] == [2, 3, 5]


def test_the_backoff_doubles_from_its_first_wait_up_to_its_longest() -> None:
    assert [STANDARD_BACKOFF.delay(n).total_seconds() for n in range(0, 10)] == [
        30,
        30,
        60,
        120,
        240,
        480,
        960,
        1920,
        3600,
        3600,
    ]
    assert STANDARD_BACKOFF.delay(10**9) == timedelta(hours=1)  # no overflow, however many failures
    tenth = Backoff(first=timedelta(seconds=0.1), most=timedelta(seconds=1))
    assert [tenth.delay(n) for n in (1, 2, 4, 5)] == [
        timedelta(seconds=0.1),
        timedelta(seconds=0.2),
        timedelta(seconds=0.8),
        timedelta(seconds=1),
    ]


def test_the_retry_policy_gives_up_after_max_attempts_or_at_once_without_a_backoff() -> None:
    verdicts = [(f.given_up, f.delay) for f in (RETRY.failure("x", n) for n in (1, 2, 3, 4))]
    assert verdicts == [
        (False, timedelta(seconds=10)),
        (False, timedelta(seconds=20)),
        (True, timedelta(seconds=40)),
        (True, timedelta(seconds=40)),
    ]
    once = Retry(max_attempts=1).failure(ValueError("bad data"), 1)
    assert (once.given_up, once.delay, once.retry_at(datetime(2030, 1, 1))) == (True, None, None)


def test_a_statement_error_outside_a_triggers_rules_backs_off_that_trigger_only(
    client: TestClient[Any], runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two contact.created triggers; the first one's attempt hits a statement error after its rule ran
    create_rule(client, "contact.created", [add_tag("seen")])
    contacts = []
    for _ in range(2):
        response = client.post("/v1/contacts", json={"phone": new_phone()})
        assert response.status_code == 201, response.text
        contacts.append(response.json()["id"])
    [(broken,)] = rows(runtime.pool, "SELECT min(id) FROM followup_triggers")
    run = triggers._run

    def failing(conn: Connection[Any], trigger: Any, *args: Any) -> Failed | None:
        failed = run(conn, trigger, *args)
        if trigger.id == broken:
            conn.execute("SELECT 1 / 0")
        return failed

    monkeypatch.setattr(triggers, "_run", failing)
    now = runtime.clock.now()

    # When the batch runs
    processed = triggers.process_triggers(runtime.pool, runtime.clock)

    # Then that trigger is rolled back and retried after the backoff; the other one is processed
    assert processed.triggers == 2
    found = rows(
        runtime.pool,
        "SELECT id, attempts, outcome, next_attempt_at, last_error FROM followup_triggers ORDER BY id",
    )
    (first, attempts, outcome, due_at, error), (_, *second) = found
    assert (first, attempts, outcome, due_at) == (broken, 1, None, now + triggers.BACKOFF_MIN)
    assert "DivisionByZero" in error
    assert second[:2] == [0, "processed"]
    assert processed.outcomes[("contact.created", "retry")] == 1
    assert rows(runtime.pool, "SELECT count(*) FROM rule_runs WHERE trigger_id = %s", broken) == [(0,)]


def test_round_robin_walks_on_after_the_last_project_served_in_circular_order() -> None:
    first, second, third = (uuid.UUID(int=i) for i in (10, 20, 30))
    turns = RoundRobin()
    assert turns.params(50) == {"after": uuid.UUID(int=0), "projects": 50, "limit": 50}
    turns.served([third, first, second])  # in any order (an UPDATE's RETURNING has none)
    assert turns.after == third
    turns.after = second
    turns.served([first, third])  # the walk went on past the second to the third, then wrapped to the first
    assert turns.after == first
    turns.served([])
    assert turns.after == first
