"""Jobs: the one backoff policy, and the one runner of the queues whose items are claimed, run, then done,
retried later or given up: rule triggers, delayed rule executions, webhook deliveries and a bulk job's
contacts (the release step backs off with the same policy).

**Backoff** (:class:`Backoff`): the wait after the n-th failed attempt in a row is ``first`` doubled n - 1
times, at most ``most`` (30 s, 1 min, 2 min, ... 1 h for every queue today). **Retry** (:class:`Retry`): a
queue's backoff and its number of attempts; the attempt numbered ``max_attempts`` that fails gives the item
up.

**The runner** (:func:`run_batch`). A queue (:class:`Queue`) supplies what is its own: its claim (a batch,
locked or leased), how one item's attempt is isolated (a transaction of its own from the pool, a SAVEPOINT
in the caller's transaction, or nothing when the item holds its transactions itself, as a webhook delivery
does around its HTTP call), the run of one item, and its outcome writers. The after-commit effects an
attempt registers (:mod:`libs.common.core.effects`) follow its isolation: run after the item's own COMMIT
(:class:`OwnTransactions`, with the queue's runtime), kept or dropped with its :func:`savepoint`. The
runner does the rest, the same for every queue::

    claim -> for each item, its attempt in its isolation:
               done       the run wrote its outcome (done, skipped, not this worker's any more)
               refused    the run raised one of ``refusals`` (an outcome, not a failure): the attempt is
                          rolled back and ``refused`` writes the outcome
               failed     the run returned :class:`Failed`: the failure is written in the same isolation,
                          so it commits with the work the attempt kept (the rules that ran before it)
               raised     any of ``item_errors`` (statement-level errors included): the attempt is rolled
                          back and the failure is written outside it
             a failure: the retry policy says retry after the backoff, or give up after the last attempt;
             ``record`` writes it (with its counts and logs). An error while writing it is logged with
             the item's ids: the item comes back when its lease runs out.

An item's error never aborts the batch: it backs off that item only and the next item runs. Errors outside
``item_errors`` propagate (a bulk chunk is rolled back whole and redone).

**Fairness across projects**: :func:`run_batch` hands the claim a :class:`Fairness` whose
:meth:`~Fairness.params` its SQL reads. :data:`OLDEST_FIRST` takes the oldest due first, whatever the
project. A :class:`RoundRobin` (the rules' queues: triggers, delayed executions, bulk jobs) shares the batch
among the projects with pending work: each takes at most its share (the batch over their number, at least
one item), at most ``limit`` projects a batch, walked from where this queue's previous batch in this process
stopped, so a project's backlog of any size delays another project's single item by one batch at most,
and a thousand projects with work each get their turn. Such a claim is two steps (:func:`claim_in_turns`):
one read without locks walks the projects and gives each its share, then each project's claim is a
statement of its own with an equality on ``project_id`` (on Citus, routed to one shard), all of them sent
in one round trip.
"""

from __future__ import annotations

import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, LiteralString, TypeVar

from psycopg import Connection
from psycopg.rows import RowFactory
from psycopg_pool import ConnectionPool

from libs.common.core import effects
from libs.common.core.db import buffered_pipeline, fetch_each

if TYPE_CHECKING:
    from libs.common.core.runtime import Runtime

log = logging.getLogger(__name__)

#: An item of a queue.
T = TypeVar("T")
#: What an item's attempt runs with: a connection (its transaction or savepoint), or the pool.
C = TypeVar("C")

#: Doublings past which every backoff is at its longest (a float stays finite).
_MAX_DOUBLINGS = 1000


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: the wait after the n-th failed attempt in a row is ``first`` doubled n - 1 times,
    at most ``most``."""

    first: timedelta
    most: timedelta

    def delay(self, failures: int) -> timedelta:
        """The wait after the ``failures``-th failed attempt in a row (1: the first; 0 or less: ``first``)."""
        doublings = min(max(0, failures - 1), _MAX_DOUBLINGS)
        if self.first.total_seconds() * 2.0**doublings >= self.most.total_seconds():
            return self.most
        return self.first * (1 << doublings)


#: The backoff of every queue (and the release's default): 30 s, 1 min, 2 min, ... at most an hour.
STANDARD_BACKOFF = Backoff(first=timedelta(seconds=30), most=timedelta(hours=1))


@dataclass(frozen=True)
class Failure:
    """A failed attempt as the retry policy judged it."""

    error: BaseException | str
    #: Which attempt failed (1: the first).
    attempt: int
    #: The backoff after it (None: the queue never retries).
    delay: timedelta | None
    #: Whether the item is given up (its last attempt failed), else it is retried after ``delay``.
    given_up: bool
    #: What the failing attempt knew that the writer needs (the rule that failed, the HTTP result).
    about: Any = None

    def retry_at(self, now: datetime) -> datetime | None:
        """When the item is due again (None: never)."""
        return now + self.delay if self.delay is not None else None


@dataclass(frozen=True)
class Retry:
    """How a queue retries an item whose attempt failed: after the backoff, until the attempt numbered
    ``max_attempts`` failed; then the item is given up. Without a backoff, a failure gives it up at once."""

    max_attempts: int
    backoff: Backoff | None = None

    def failure(self, error: BaseException | str, attempt: int, about: Any = None) -> Failure:
        """The verdict on the ``attempt``-th attempt (1: the first) that failed with ``error``."""
        delay = self.backoff.delay(attempt) if self.backoff is not None else None
        given_up = delay is None or attempt >= self.max_attempts
        return Failure(error=error, attempt=attempt, delay=delay, given_up=given_up, about=about)


class Fairness:
    """How a claim shares a batch among projects: the oldest due first, whatever the project."""

    name = "oldest_first"

    def params(self, limit: int) -> dict[str, Any]:
        """The claim's parameters (the SQL of a claim that takes turns reads them)."""
        return {}

    def served(self, project_ids: Sequence[uuid.UUID]) -> None:
        """The projects the claim took items of."""

    def __repr__(self) -> str:
        return f"<{self.name}>"


#: The oldest due items first, whatever their project.
OLDEST_FIRST = Fairness()

#: Where a walk of the projects starts before any batch: the smallest uuid.
FIRST_PROJECT = uuid.UUID(int=0)


class RoundRobin(Fairness):
    """Turns across projects for one queue in this process: the claim walks the projects with pending work
    in id order from ``after`` (wrapping around), at most ``limit`` of them, and takes at most
    ``share`` = the batch over their number (at least one) items of each; the next batch walks on from the
    last project served. SQL parameters: ``after``, ``projects`` and ``limit``."""

    name = "round_robin"

    def __init__(self) -> None:
        self.after = FIRST_PROJECT

    def params(self, limit: int) -> dict[str, Any]:
        return {"after": self.after, "projects": limit, "limit": limit}

    def served(self, project_ids: Sequence[uuid.UUID]) -> None:
        """The next walk starts after the last of ``project_ids`` in this walk's order (ids after
        ``after``, then from the first: whatever order they are given in)."""
        if project_ids:
            self.after = max(project_ids, key=lambda project_id: (project_id <= self.after, project_id))


R = TypeVar("R")


def claim_in_turns(
    conn: Connection[Any],
    shares: LiteralString,
    claim: LiteralString,
    params: dict[str, Any],
    row_factory: RowFactory[R],
    *,
    prepare: bool | None = None,
) -> list[R]:
    """A claim in turns across projects: ``shares`` (a read without locks, across projects) answers the
    projects in turn with each one's share of the batch; then ``claim`` runs once per project with
    ``project_id`` and ``share`` added to ``params`` (a statement naming one project: routed to one shard on
    Citus), every claim in one pipeline (one round trip). Rows come in the projects' order. ``prepare``
    False: the claims are never prepared statements (:func:`~libs.common.core.db.fetch_each`)."""
    with buffered_pipeline(conn):  # the transaction's BEGIN goes with the read
        found = conn.execute(shares, params)
    turns = found.fetchall()
    each = [params | {"project_id": project_id, "share": share} for project_id, share in turns]
    return fetch_each(conn, claim, each, row_factory, prepare=prepare)


@dataclass(frozen=True)
class Failed:
    """What a run returns when its attempt failed but keeps its work (committed with the failure)."""

    error: BaseException | str
    #: Which attempt failed (None: the queue's :meth:`Queue.attempt` of the item tells).
    attempt: int | None = None
    about: Any = None


class Queue(ABC, Generic[T, C]):
    """A queue of jobs: what is its own (claim, isolation, run, writers); :func:`run_batch` runs it."""

    #: How a failed item is retried.
    retry: ClassVar[Retry]
    #: Errors that are an item's outcome, not a failure (a business refusal): see :meth:`refused`.
    refusals: ClassVar[tuple[type[Exception], ...]] = ()
    #: Errors of one item, statement-level ones included: they back off that item only.
    item_errors: ClassVar[tuple[type[Exception], ...]] = (Exception,)

    @abstractmethod
    def claim(self, limit: int, fairness: Fairness) -> Sequence[T]:
        """A batch of due items, locked or leased to this worker."""

    @abstractmethod
    def isolate(self) -> AbstractContextManager[C]:
        """The isolation of one item's attempt: rolled back when the attempt raises."""

    def outside(self) -> AbstractContextManager[C]:
        """Where a rolled-back attempt's refusal or failure is written (by default a new isolation)."""
        return self.isolate()

    @abstractmethod
    def run(self, ctx: C, item: T) -> Failed | None:
        """One attempt at ``item``; writes its outcome (done, skipped), or returns :class:`Failed`."""

    def refused(self, ctx: C, item: T, refusal: Exception) -> None:
        """Write the outcome of an attempt rolled back by one of :attr:`refusals`."""
        raise refusal

    def attempt(self, item: T) -> int | None:
        """Which attempt at ``item`` this is (1: the first); None: unknown, a raised failure is not recorded
        (the item comes back when its lease runs out)."""
        return None

    @abstractmethod
    def record(self, ctx: C, item: T, failure: Failure) -> bool:
        """Write a failed attempt: due again at ``failure.retry_at(now)``, or given up; False when the item is
        no longer this worker's (its lease ran out and it was claimed again)."""

    def describe(self, item: T) -> dict[str, Any]:
        """The item's ids, for the logs."""
        return {}


class OwnTransactions(Queue[T, Connection[Any]]):
    """A queue whose items each run in a transaction of their own, on a connection of ``pool``; the
    after-commit effects an item's transaction registered run after its COMMIT, with ``runtime`` (None:
    dropped)."""

    pool: ConnectionPool
    runtime: Runtime | None = None

    def isolate(self) -> AbstractContextManager[Connection[Any]]:
        return effects.committed(self.pool, self.runtime)


@dataclass
class Ran:
    """What one batch did."""

    claimed: int = 0
    #: Attempts that wrote their outcome (done, skipped) or found the item no longer theirs.
    done: int = 0
    refused: int = 0
    retried: int = 0
    given_up: int = 0
    #: Failures not written: the item was claimed again by another worker, or the write itself failed.
    lost: int = 0
    #: The ids of the items whose failure could not be written.
    unrecorded: list[dict[str, Any]] = field(default_factory=list)


def run_batch(queue: Queue[T, C], *, limit: int, fairness: Fairness = OLDEST_FIRST) -> Ran:
    """Claim a batch of ``queue`` and attempt each item in its isolation; returns what the batch did."""
    items = queue.claim(limit, fairness)
    ran = Ran(claimed=len(items))
    for item in items:
        run_item(queue, item, ran)
    return ran


def run_item(queue: Queue[T, C], item: T, ran: Ran | None = None) -> Ran:
    """One attempt at ``item``: its outcome, its refusal or its failure written (see the module)."""
    ran = ran if ran is not None else Ran()
    error: Exception
    try:
        with queue.isolate() as ctx:
            failed = queue.run(ctx, item)
            if failed is not None:
                _record(queue, ctx, item, failed.error, failed.attempt, failed.about, ran)
                return ran
    except queue.refusals as refusal:
        try:
            with queue.outside() as ctx:
                queue.refused(ctx, item, refusal)
            ran.refused += 1
        except queue.item_errors as exc:
            _unrecorded(queue, item, exc, ran)
        return ran
    except queue.item_errors as exc:
        error = exc
    else:
        ran.done += 1
        return ran
    try:
        with queue.outside() as ctx:
            _record(queue, ctx, item, error, None, None, ran)
    except queue.item_errors as exc:
        _unrecorded(queue, item, exc, ran)
    return ran


def _record(
    queue: Queue[T, C],
    ctx: C,
    item: T,
    error: BaseException | str,
    attempt: int | None,
    about: Any,
    ran: Ran,
) -> None:
    attempt = attempt if attempt is not None else queue.attempt(item)
    if attempt is None:
        _unrecorded(queue, item, error, ran)
        return
    failure = queue.retry.failure(error, attempt, about)
    if not queue.record(ctx, item, failure):
        ran.lost += 1
    elif failure.given_up:
        ran.given_up += 1
    else:
        ran.retried += 1


def _unrecorded(queue: Queue[T, C], item: T, error: BaseException | str, ran: Ran) -> None:
    ids = queue.describe(item)
    ran.lost += 1
    ran.unrecorded.append(ids)
    log.error(
        "job failure not recorded; the item comes back when its lease runs out",
        extra=ids | {"queue": type(queue).__name__, "error": repr(error)},
        exc_info=error if isinstance(error, BaseException) else None,
    )


@contextmanager
def savepoint(conn: Connection[Any]) -> Iterator[Connection[Any]]:
    """An item's attempt in a SAVEPOINT of the caller's transaction: the after-commit effects it registered
    are kept with the savepoint (run after the caller's COMMIT) or dropped with its rollback."""
    with effects.savepoint(conn):
        yield conn
