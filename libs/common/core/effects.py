"""After-commit effects: what a change asks for once its transaction has committed (wake the release
service, wake the triggers service, make every process forget a cached value, count something), registered
by the domain function that makes the change, on the connection it was given, and run by the transaction
that owns the connection, once, after COMMIT succeeded (Django's ``transaction.on_commit``)::

    with effects.transaction(runtime) as conn:  # the API's and the ingress's transactions
        enroll(conn, project_id, request, now=now)  # registers NudgeRelease(project_id, enrollment_id)
    # committed: the release service is nudged now

- **Never before the commit, never after a rollback.** An exception out of the block, or a COMMIT that
  fails, drops what was registered; a savepoint opened with :func:`savepoint` that rolls back drops what
  was registered inside it, and only that (a plain ``conn.transaction()`` does not know of effects: a
  savepoint whose block may register one is opened with :func:`savepoint`, or with :class:`Savepoint`
  when its commands ride in the caller's pipelines); one opened with :func:`rolled_back` always rolls back
  and drops them.
- **Once per transaction.** Effects with the same :attr:`Effect.key` run once: a nudge wakes a loop, so
  a bulk that makes 500 enrollments due sends one release nudge for the project, not 500.
- **Never an error.** An effect that fails is logged (``after-commit effect failed``); the change stays
  committed and the request that made it succeeds.
- **Nested use** is one transaction per connection: a block opened inside another takes a connection of
  its own and runs its effects after its own commit.
- **Workers** run them too: the job runner's (:mod:`libs.common.core.jobs`) item in a transaction of its
  own runs its effects after that item's COMMIT (:func:`committed`, with the worker's runtime); an item in
  a savepoint keeps or drops them with the savepoint, and the caller's transaction runs them after its
  COMMIT. The triggers service's rules that enroll nudge the release service that way, as the API does.
- **A connection used without** :func:`transaction` or :func:`committed` (a plain ``pool.connection()``):
  what is registered on it is never run, and is dropped when the pool hands the connection out again (the
  pool's check, :func:`libs.common.core.db.check_connection`, calls :func:`discard`), so it never leaks
  into another transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from psycopg import Connection, sql
from psycopg_pool import ConnectionPool

from libs.common.contracts import actors
from libs.common.core import broker

if TYPE_CHECKING:
    from libs.common.core.runtime import Runtime

log = logging.getLogger(__name__)

#: The connection attribute that holds its pending effects (by key, in the order they were registered).
_PENDING = "_followups_after_commit"


class Effect(Protocol):
    """Something to do once the transaction that asked for it has committed."""

    @property
    def key(self) -> Hashable:
        """Effects with equal keys registered in one transaction run once (the first one registered)."""
        ...

    def run(self, runtime: Runtime) -> None: ...


@dataclass(frozen=True)
class NudgeRelease:
    """An enrollment became due now: wake a release worker instead of waiting for its next poll.

    One per project and transaction: the nudge wakes the release loop, which releases every due enrollment
    (the first enrollment registered is the one the message names)."""

    project_id: uuid.UUID
    enrollment_id: uuid.UUID

    @property
    def key(self) -> Hashable:
        return ("release", self.project_id)

    def run(self, runtime: Runtime) -> None:
        message = actors.ReleaseNudge(project_id=self.project_id, enrollment_id=self.enrollment_id)
        broker.nudge(runtime.broker, actors.RELEASE_NUDGE, message)


@dataclass(frozen=True)
class NudgeTriggers:
    """Triggers were recorded (or a bulk job queued or cancelled): wake the triggers service's loops."""

    project_id: uuid.UUID

    @property
    def key(self) -> Hashable:
        return ("triggers", self.project_id)

    def run(self, runtime: Runtime) -> None:
        broker.nudge(runtime.broker, actors.TRIGGERS_NUDGE, actors.TriggersNudge(project_id=self.project_id))


@dataclass(frozen=True)
class Invalidate:
    """A cached value of the project changed: every process forgets it (this one at once), see
    :mod:`libs.common.core.invalidation`."""

    #: What the cache holds (``rules.INVALIDATION_KIND``, ...).
    kind: str
    project_id: uuid.UUID

    @property
    def key(self) -> Hashable:
        return ("invalidate", self.kind, self.project_id)

    def run(self, runtime: Runtime) -> None:
        runtime.invalidator.publish(self.kind, self.project_id)


@dataclass(frozen=True, eq=False)
class Observe:
    """Count (or log) what the transaction did, once it committed: ``observe()`` is called then. Never
    deduplicated: each registration counts."""

    #: What it counts, for the log line of a failure.
    what: str
    observe: Callable[[], None] = field(repr=False)

    @property
    def key(self) -> Hashable:
        return self

    def run(self, runtime: Runtime) -> None:
        self.observe()


def after_commit(conn: Connection[Any], effect: Effect) -> None:
    """Run ``effect`` once the transaction ``conn`` is in has committed (dropped if it rolls back)."""
    _pending(conn).setdefault(effect.key, effect)


def pending(conn: Connection[Any]) -> list[Effect]:
    """The effects registered on ``conn`` and not yet run or dropped, in the order they were registered."""
    return list(getattr(conn, _PENDING, {}).values())


def discard(conn: Connection[Any]) -> None:
    """Drop what was registered on ``conn`` (its transaction rolled back, or nobody runs it)."""
    registered: dict[Hashable, Effect] | None = getattr(conn, _PENDING, None)
    if registered:
        registered.clear()


@contextmanager
def savepoint(conn: Connection[Any]) -> Iterator[None]:
    """A savepoint (``conn.transaction()``) whose rollback also drops the effects registered inside it;
    those registered before it are kept, and those registered again inside it too."""
    mark = _mark(conn)
    with conn.transaction():
        try:
            yield
        except BaseException:  # psycopg's Rollback included: the savepoint is rolled back either way
            _drop_since(conn, mark)
            raise


class Savepoint:
    """A savepoint whose commands go out with the caller's statements: :meth:`open` and :meth:`release`
    send theirs as the next statement of ``conn``, so in pipeline mode they are queued with the statements
    around them and cost no round trip of their own (``conn.transaction()`` syncs the pipeline at both
    ends). :meth:`rollback` rolls the savepoint back, with the effects registered since it was opened (as
    :func:`savepoint` does); the caller decides what follows. Not released, it ends with the transaction."""

    def __init__(self, conn: Connection[Any], name: str) -> None:
        self.conn = conn
        self.name = sql.Identifier(name)
        self.mark = 0

    def open(self) -> None:
        self.mark = _mark(self.conn)
        self.conn.execute(sql.SQL("SAVEPOINT {}").format(self.name))

    def release(self) -> None:
        self.conn.execute(sql.SQL("RELEASE SAVEPOINT {}").format(self.name))

    def rollback(self) -> None:
        self.conn.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(self.name))
        _drop_since(self.conn, self.mark)


@contextmanager
def rolled_back(conn: Connection[Any]) -> Iterator[None]:
    """A savepoint (or a transaction, on a connection outside one) that is always rolled back, however its
    block ends: nothing written inside it survives, and the effects registered inside it are dropped (a
    dry run)."""
    mark = _mark(conn)
    try:
        with conn.transaction(force_rollback=True):
            yield
    finally:
        _drop_since(conn, mark)


@contextmanager
def transaction(runtime: Runtime) -> Iterator[Connection[Any]]:
    """A transaction on a connection of ``runtime``'s pool: committed when the block ends (rolled back on
    an error), then the effects registered on it run, once, with ``runtime``'s broker and invalidator."""
    with committed(runtime.pool, runtime) as conn:
        yield conn


@contextmanager
def committed(pool: ConnectionPool, runtime: Runtime | None) -> Iterator[Connection[Any]]:
    """A transaction on a connection of ``pool`` (a job's item in a transaction of its own): committed when
    the block ends (rolled back on an error), then the effects registered on it run with ``runtime``; with
    no runtime (a benchmark's or a test's worker that does not look at them) they are dropped."""
    with pool.connection() as conn:  # the pool's check dropped what an earlier user left on it
        try:
            yield conn
        except BaseException:
            discard(conn)
            raise
        effects = pending(conn)
        discard(conn)
    if runtime is not None:
        run(runtime, effects)  # reached only once COMMIT succeeded


def run(runtime: Runtime, effects: list[Effect]) -> None:
    """Run committed effects in the order they were registered; a failure is logged, never raised."""
    for effect in effects:
        try:
            effect.run(runtime)
        except Exception:
            log.exception("after-commit effect failed", extra={"effect": repr(effect)})


def _mark(conn: Connection[Any]) -> int:
    """How many effects are registered on ``conn`` now (where a savepoint begins)."""
    return len(_pending(conn))


def _drop_since(conn: Connection[Any], mark: int) -> None:
    """Drop the effects registered on ``conn`` after ``mark`` (its savepoint rolled back)."""
    registered = _pending(conn)
    for key in list(registered)[mark:]:
        del registered[key]


def _pending(conn: Connection[Any]) -> dict[Hashable, Effect]:
    registered: dict[Hashable, Effect] | None = getattr(conn, _PENDING, None)
    if registered is None:
        registered = {}
        setattr(conn, _PENDING, registered)
    return registered
