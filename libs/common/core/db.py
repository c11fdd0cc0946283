"""PostgreSQL access: the connection pool and error mapping at the database boundary.

The pool fails fast and recovers fast when PostgreSQL goes away (docs/operations.md, "Database outages"):

- a checkout waits at most ``DATABASE_POOL_TIMEOUT_SECONDS`` (2 s): then ``PoolTimeout``, an
  ``OperationalError`` that :func:`map_errors` turns into :class:`DatabaseUnavailable` (the API's 503);
- every connection is checked when it is handed out (:func:`check_connection`), so the connections an
  outage broke are dropped at once instead of failing the request that gets them;
- connecting gives up after :data:`CONNECT_TIMEOUT_SECONDS` (a host that drops packets would otherwise
  hold a pool worker for minutes);
- reconnecting never backs off beyond ~1 s: see :data:`RECONNECT_TIMEOUT_SECONDS`;
- JIT compilation is off for the pool's sessions (:data:`SESSION_OPTIONS`, unless the URL sets ``options``):
  our statements are short, and a large one (a claim walking projects, a project's many rules matched in
  one statement) would otherwise spend far longer compiling its expressions than running them;
- JSON (``jsonb`` parameters and columns: a trigger's payload, a rule run's trace, an enrollment's
  variables) is written and read with msgspec (:func:`json_loads`), several times faster than the standard
  library's ``json``, which psycopg uses by default;
- a multi-host ``DATABASE_URL`` with ``target_session_attrs=read-write`` follows the primary: libpq connects
  to the first host that takes writes, and a connection to a server that no longer does (a demoted primary
  in hot standby, or one made read-only) is dropped when it is handed out (:func:`check_connection`).

An outage is logged once per process (:data:`DATABASE`): one warning when PostgreSQL stops answering (a
loop's tick, a request, or the pool's own attempt to connect fails because the server is out of reach),
one info when a connection is made or handed out again; the pool's own line per failed attempt is kept
out of the log (:class:`PoolLog`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, LiteralString, TypeVar

import msgspec
import psycopg
from psycopg import Pipeline
from psycopg import errors as pgerrors
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_to_dict
from psycopg.generators import send
from psycopg.rows import RowFactory
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from libs.common.core import effects
from libs.common.core.errors import DatabaseUnavailable, FollowupsError, InvalidInput
from libs.common.core.outage import Outage
from libs.common.core.queued import hand_over, queue_command
from libs.common.core.settings import DatabaseSettings

log = logging.getLogger(__name__)

_decode_json = msgspec.json.Decoder().decode


def json_loads(data: bytes | str) -> Any:
    """A ``jsonb`` value as Python, decoded by msgspec; a number beyond a float's range (which PostgreSQL's
    ``jsonb`` keeps and msgspec refuses) falls back to the standard library's reading (``inf``)."""
    try:
        return _decode_json(data)
    except msgspec.DecodeError:
        return json.loads(data)


# every connection of the process (psycopg's global adapters): msgspec writes what json.dumps writes (a
# NaN, which PostgreSQL refuses, becomes null) and encodes a UUID or a time as their JSON strings
set_json_dumps(msgspec.json.Encoder().encode)
set_json_loads(json_loads)

#: Maps a constraint name to the domain error its violation means.
ConstraintErrors = Mapping[str, Callable[[], FollowupsError]]

#: libpq ``connect_timeout`` (2 s is its floor) unless the URL sets one.
CONNECT_TIMEOUT_SECONDS = 2
#: The pool's sessions' settings unless the URL sets ``options``: no JIT (see the module).
SESSION_OPTIONS = "-c jit=off"

#: The pool's ``reconnect_timeout``. psycopg_pool retries a failed connection attempt after 1 s, 2 s, 4 s,
#: ... without bound until ``reconnect_timeout`` (5 min by default) has passed: after a 40 s outage the next
#: attempt may be 30 s away. Giving a connection up after 2 s keeps the attempts ~1 s apart (1 s, then the
#: 1 s left); a checkout that finds the pool short then grows it again at once, so a process that is asked
#: for work tries to reconnect every second, and one that is not costs nothing.
RECONNECT_TIMEOUT_SECONDS = 2.0

#: PostgreSQL as this process sees it: one warning when it is lost, one info when it is back.
DATABASE = Outage(log, "requests answer 503 and the loops retry", server="PostgreSQL")

#: ``target_session_attrs`` values that ask for a server taking writes.
_READ_WRITE = frozenset({"read-write", "primary"})


class PoolLog(logging.Filter):
    """Keeps psycopg_pool's line per failed connection attempt (a warning about every second during an
    outage) out of the log, reporting it to :data:`DATABASE` instead: one warning for the outage."""

    _ATTEMPTS = ("error connecting in", "reconnection attempt in pool", "discarding broken connection")

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if not message.startswith(self._ATTEMPTS):
            return True
        if message.startswith(self._ATTEMPTS[0]) and isinstance(record.args, tuple) and len(record.args) > 1:
            error = record.args[1]
            if isinstance(error, BaseException) and server_unavailable(error):
                DATABASE.failed(error)
        return False


def quiet_pool() -> None:
    logger = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, PoolLog) for f in logger.filters):
        logger.addFilter(PoolLog())


#: How long :func:`create_pool` waits for a first connection (PostgreSQL may be starting alongside).
OPEN_TIMEOUT_SECONDS = 30.0


def create_pool(settings: DatabaseSettings, *, name: str = "followups", open_: bool = True) -> ConnectionPool:
    """A psycopg pool; connections are in transaction mode (``with pool.connection()`` commits).

    ``open_``: open it and wait (up to :data:`OPEN_TIMEOUT_SECONDS`) until it hands out a connection."""
    kwargs: dict[str, Any] = {"application_name": name}
    conninfo = conninfo_to_dict(settings.url)
    if "connect_timeout" not in conninfo:
        kwargs["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    read_write = str(conninfo.get("target_session_attrs", "")) in _READ_WRITE
    quiet_pool()
    pool = ConnectionPool(
        settings.url,
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        name=name,
        open=False,
        kwargs=kwargs,
        timeout=settings.pool_timeout_seconds,
        check=check_primary if read_write else check_connection,
        configure=_connected,
        reconnect_timeout=RECONNECT_TIMEOUT_SECONDS,
    )
    if open_:
        _open(pool, OPEN_TIMEOUT_SECONDS)
    return pool


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's check of a connection it hands out: raises if the server has closed it. The after-commit
    effects an earlier user registered and did not run are dropped (:mod:`libs.common.core.effects`).

    An idle connection has nothing to read unless the server said goodbye (a restart's "terminating
    connection", an idle timeout, the end of a stream a network outage cut): only then is it checked with
    psycopg's empty query. A poll of the socket costs ~20 us; the query, a round trip (~0.4 ms) per
    checkout."""
    _check(conn)
    DATABASE.succeeded()


def _check(conn: psycopg.Connection[Any]) -> None:
    effects.discard(conn)
    if conn.closed or _has_input(conn.pgconn.socket):
        ConnectionPool.check_connection(conn)


def check_primary(conn: psycopg.Connection[Any]) -> None:
    """:func:`check_connection`, and raises if the server no longer takes writes, as PostgreSQL reports
    to every session (``in_hot_standby``, ``default_transaction_read_only``: sent by the server when they
    change, read by libpq with the next answer): a demoted primary, or one fenced read-only. The pool
    then connects anew, and ``target_session_attrs=read-write`` finds the primary."""
    _check(conn)
    for parameter in ("in_hot_standby", "default_transaction_read_only"):
        if conn.info.parameter_status(parameter) == "on":
            conn.close()  # a failed check returns the connection to the pool: closed, it is dropped there
            raise psycopg.OperationalError(f"the server no longer takes writes ({parameter} is on)")
    DATABASE.succeeded()


def _connected(conn: psycopg.Connection[Any]) -> None:
    """The pool's ``configure``: a new connection means PostgreSQL answers."""
    DATABASE.succeeded()


def _has_input(fd: int) -> bool:
    """Whether ``fd`` has something to read (or has hung up), without waiting."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # Windows: no poll()


def _open(pool: ConnectionPool, timeout: float) -> None:
    """Open ``pool`` and wait until it hands out a connection; closed and ``PoolTimeout`` after ``timeout``.

    Not ``pool.open(wait=True)``: with a short ``reconnect_timeout`` the pool gives its first connections
    up after 2 s and would then wait for nothing; each checkout here asks it to connect again."""
    pool.open()
    deadline = time.monotonic() + timeout
    while True:
        try:
            with pool.connection(timeout=max(0.1, min(pool.timeout, deadline - time.monotonic()))):
                return
        except PoolTimeout:
            if time.monotonic() >= deadline:
                pool.close()
                raise PoolTimeout(f"no connection to PostgreSQL within {timeout:g} s") from None


async def ping(url: str, *, timeout: float, name: str = "followups-ready") -> None:
    """Connect to ``url`` and run ``SELECT 1`` within ``timeout`` seconds, on a connection of its own.

    For a readiness probe: it shares neither the pool's connections nor its queue of waiting checkouts,
    nor the request threads; :class:`DatabaseUnavailable` when PostgreSQL does not answer in time."""
    try:
        async with asyncio.timeout(timeout):
            conn = await psycopg.AsyncConnection.connect(
                url, autocommit=True, application_name=name, connect_timeout=CONNECT_TIMEOUT_SECONDS
            )
            async with conn:
                await conn.execute("SELECT 1")
    except (psycopg.OperationalError, TimeoutError) as exc:
        raise DatabaseUnavailable() from exc


R = TypeVar("R")


def fetch_each(
    conn: psycopg.Connection[Any],
    query: LiteralString,
    params: Sequence[Mapping[str, Any]],
    row_factory: RowFactory[R],
    *,
    prepare: bool | None = None,
) -> list[R]:
    """``query`` run once for each of ``params``, every run in one pipeline (one round trip), their rows
    together in order: a statement per project (each routed to one shard on Citus) at the cost of one."""
    if not params:
        return []
    rows: list[R] = []
    if prepare is False:  # never prepared: a cursor each, all sent in one pipeline, then read
        cursors = [conn.cursor(row_factory=row_factory) for _ in params]
        with buffered_pipeline(conn):
            for cur, each in zip(cursors, params, strict=True):
                cur.execute(query, each, prepare=False)
        for cur in cursors:
            rows += cur.fetchall()
            cur.close()
        return rows
    with conn.cursor(row_factory=row_factory) as cur:
        cur.executemany(query, params, returning=True)
        while True:
            rows += cur.fetchall()
            if not cur.nextset():
                break
    return rows


@contextmanager
def buffered_pipeline(conn: psycopg.Connection[Any]) -> Iterator[Pipeline]:
    """``conn.pipeline()`` that writes to the socket once a round trip: what was queued goes when a result is
    read (with psycopg's flush request) and at the end (with the sync). psycopg's own pipeline writes each
    statement as it is queued, after waiting for the socket; on loopback TCP each write also runs the
    server's side of the stack and wakes its backend. A transaction of five statements and two round trips
    then costs two writes instead of eight. What is sent, its order and its results do
    not change; a statement's error is raised at the next read or at the end (psycopg's own pipeline raises
    it at whichever later statement happens to find its result).

    It replaces three steps of psycopg's pipeline (of the version range ``pyproject.toml`` allows):
    ``_communicate_gen`` (after each statement), ``_sync_gen`` (a transaction or pipeline opened inside)
    and ``_exit_gen``. tests/test_pipelined_transaction.py holds it to its behaviour. Every pipeline of
    the domain is one of these."""
    with conn.pipeline() as pipeline:
        if pipeline.level == 1:  # a pipeline opened inside another is the outer one, left as it is
            pipeline._communicate_gen = partial(_hand_to_libpq, pipeline)  # type: ignore[method-assign]
            pipeline._sync_gen = partial(_sync_and_fetch, pipeline)  # type: ignore[method-assign]
            pipeline._exit_gen = partial(_sync_and_fetch, pipeline)  # type: ignore[method-assign]
        yield pipeline


def _hand_to_libpq(pipeline: Pipeline) -> PQGen[None]:
    """The pipeline's step after each statement: what was queued handed to libpq (:func:`hand_over`), written
    when a result is read or at the pipeline's end; results are read and matched to their statements then,
    in order."""
    hand_over(pipeline)
    yield from ()


def _sync_and_fetch(pipeline: Pipeline) -> PQGen[None]:
    """A sync (the pipeline's end, or a transaction opened inside it) and everything queued before it in one
    write (waiting for the socket if it is full), then every result read. psycopg's own end adds a flush
    request, a write of its own."""
    written = False
    try:
        pipeline._enqueue_sync()
        yield from _hand_to_libpq(pipeline)  # the sync: libpq writes its buffer
        yield from send(pipeline.pgconn)  # what did not fit in the socket
        written = True
    finally:
        yield from pipeline._fetch_gen(flush=not written)


@contextmanager
def pipelined_transaction(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """One transaction in one pipeline, in as few round trips as its reads allow: its ``BEGIN`` travels with
    its first statement and its ``COMMIT`` with its last writes (and the pipeline's end). A transaction
    that reads once, then writes, costs two round trips; psycopg's own transaction in a pipeline costs two
    more (it waits for ``BEGIN``, and for a second sync once committed).

    ``conn`` is idle (a connection from the pool, not in a transaction); an exception out of the block, or a
    statement that fails, rolls the transaction back and is raised. The connection keeps its autocommit
    setting (off for the pool's); one whose state cannot be restored (the server went away) is closed, so
    the pool drops it."""
    autocommit = conn.autocommit
    conn.autocommit = True  # psycopg then starts nothing itself: BEGIN and COMMIT are sent as statements
    try:
        with buffered_pipeline(conn):
            queue_command(conn, "BEGIN")
            yield conn
            queue_command(conn, "COMMIT")
    except BaseException:
        roll_back(conn)
        raise
    finally:
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.autocommit = autocommit
        else:
            conn.close()


def roll_back(conn: psycopg.Connection[Any]) -> None:
    """Roll back what ``conn`` has in progress after a failure; a connection whose state cannot be restored
    (the server went away, or it is still in a transaction) is closed, so the pool drops it (the failure
    being handled says why)."""
    if not conn.closed:
        try:
            conn.rollback()
        except psycopg.Error:
            conn.close()
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.close()


def server_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server is out of reach (no connection, a connection lost or refused, the
    server shutting down), not that a statement failed: the work is not at fault and is tried again."""
    if isinstance(exc, pgerrors.ReadOnlySqlTransaction):
        return True  # a write on a server that has become read-only: the next connection finds the primary
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


@contextmanager
def map_errors(constraints: ConstraintErrors | None = None) -> Iterator[None]:
    """Turn driver errors into domain errors: a named unique violation, an unreachable server."""
    try:
        yield
    except pgerrors.IntegrityError as exc:
        name = exc.diag.constraint_name
        if constraints and name is not None and name in constraints:
            raise constraints[name]() from exc
        raise
    except pgerrors.ReadOnlySqlTransaction as exc:
        # the server was demoted (or fenced read-only) under this connection: the pool drops it at its
        # next checkout (check_primary), and a retry goes to the primary
        DATABASE.failed(exc)
        raise DatabaseUnavailable() from exc
    except pgerrors.ProgramLimitExceeded as exc:
        # a value too large for the database (an index row over its size limit): the input's, not an outage
        raise InvalidInput(f"a value is too large to store: {exc.diag.message_primary}") from exc
    except psycopg.OperationalError as exc:
        if server_unavailable(exc):
            DATABASE.failed(exc)  # once per outage
        else:
            log.warning("database unavailable: %s", exc)
        raise DatabaseUnavailable() from exc
