"""Statements queued straight into a connection's pipeline, without a cursor: the hot path's own.

A psycopg cursor costs about 50 µs of the client's CPU a statement beyond what libpq and the adapters do:
the cursor and its transformer are made anew, the query is looked up in the conversion and preparation
caches, and each result passes through the pipeline's and the cursor's Python layers. The release step runs
four statements a transaction; its worker spent more CPU on them than its product code.
``make bench-release`` runs the same statements through psycopg alone (``driver_tps``) to show it.

Here a statement is numbered once (:func:`~libs.common.core.sql.numbered`), its values dumped by a
transformer kept for the connection, and it is queued into the open pipeline as libpq calls, with its place
in the pipeline's result queue. It is prepared at its first use on the connection by the connection's own
preparation cache, as a cursor's statement is: psycopg's deallocations (a rollback, a statement that drops
or alters, the cache's own limit) cover it too. The pipeline then sends and reads it with everything else,
in order: an error is raised at the next read or at the pipeline's end, as for psycopg's own statements in
a pipeline. Outside a pipeline, a statement runs through a raw cursor (the same statement, the same rows).
It relies on the pipeline's and the preparation cache's inner steps, of the psycopg versions
``pyproject.toml`` allows (as :func:`~libs.common.core.db.buffered_pipeline` does).

- :func:`queue_command`: a statement without parameters or rows (``BEGIN``, ``COMMIT``).
- :func:`queue_write`: a statement whose rows are not read.
- :func:`read_row`: a statement's first row (None: no row), made by a row maker built from its result.
- :func:`read_rows`: every row of a statement, each made so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, LiteralString, NamedTuple, TypeVar
from weakref import WeakKeyDictionary, ref

from psycopg import Connection, Pipeline, RawCursor
from psycopg import errors as pgerrors
from psycopg._preparing import Prepare
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import ExecStatus
from psycopg.pq.abc import PGresult
from psycopg.rows import RowMaker

from libs.common.core.sql import Numbered, numbered

R = TypeVar("R")

#: Makes the row maker of a statement's result (its columns are read from the result).
RowMakerFor = Callable[[PGresult], RowMaker[R]]


class _Connection:
    """What this module keeps for one connection: a transformer on its adapters (kept beside the
    connection, it must not keep it alive) and its encoding."""

    def __init__(self, conn: Connection[Any]) -> None:
        self.transformer = Transformer(conn.adapters)
        self.encoding = conn.info.encoding


_CONNECTIONS: WeakKeyDictionary[Connection[Any], _Connection] = WeakKeyDictionary()


class _Statement(NamedTuple):
    """A numbered statement with its parameters' types, as psycopg's preparation cache keys it (the
    ``query`` and ``types`` of its ``PostgresQuery``)."""

    query: bytes
    types: tuple[int, ...]


#: Statements numbered once, by their text, and their text in bytes.
_NUMBERED: dict[str, tuple[Numbered, bytes]] = {}


#: The connection last asked for and its state (a worker's statements run on one connection in turn): a
#: reference to it, so as not to keep it alive.
_last: tuple[Callable[[], Connection[Any] | None], _Connection] = (lambda: None, None)  # type: ignore[assignment]


def _state(conn: Connection[Any]) -> _Connection:
    global _last
    last, state = _last
    if last() is conn:
        return state
    found = _CONNECTIONS.get(conn)
    if found is None:
        found = _CONNECTIONS[conn] = _Connection(conn)
    _last = (ref(conn), found)
    return found


def _numbered(statement: LiteralString | Numbered) -> tuple[Numbered, bytes]:
    key = statement.text if isinstance(statement, Numbered) else statement
    found = _NUMBERED.get(key)
    if found is None:
        query = statement if isinstance(statement, Numbered) else numbered(statement)
        found = _NUMBERED[key] = (query, query.text.encode())
    return found


class Queued:
    """A statement's place in the pipeline's result queue (where psycopg puts a cursor): checks its result
    and keeps it (None until read, and when it failed)."""

    __slots__ = ("_conn", "encoding", "result")

    def __init__(self, conn: Connection[Any], encoding: str) -> None:
        self._conn = conn  # psycopg validates a statement it prepared on the connection it reaches here
        self.encoding = encoding
        self.result: PGresult | None = None

    def _check_results(self, results: list[PGresult]) -> None:
        (result,) = results
        if result.status == ExecStatus.FATAL_ERROR:
            raise pgerrors.error_from_result(result, encoding=self.encoding)
        if result.status == ExecStatus.PIPELINE_ABORTED:
            raise pgerrors.PipelineAborted("pipeline aborted")

    def _set_results(self, results: list[PGresult]) -> None:
        self.result = results[0]

    def went_through(self, command: bytes) -> bool:
        """Whether the statement was read back done, as ``command`` (its command tag: ``COMMIT``; a
        ``COMMIT`` of a failed transaction reads ``ROLLBACK``)."""
        return self.result is not None and (self.result.command_status or b"").startswith(command)


def queue_command(conn: Connection[Any], command: LiteralString) -> Queued | None:
    """``command`` (no parameters, no rows: ``BEGIN``, ``COMMIT``) queued into ``conn``'s pipeline (its
    place in the result queue: whether it went through, once read), or run at once outside one (None)."""
    pipeline = conn._pipeline
    if pipeline is None:
        conn.execute(command)
        return None
    slot = Queued(conn, _state(conn).encoding)
    with conn.lock:
        pipeline.command_queue.append(partial(conn.pgconn.send_query_params, command.encode(), None))
        pipeline.result_queue.append((slot, None))  # type: ignore[arg-type]
        hand_over(pipeline)
    return slot


def queue_write(
    conn: Connection[Any], statement: LiteralString | Numbered, params: Mapping[str, Any]
) -> None:
    """``statement`` queued into ``conn``'s pipeline with ``params`` (by name), its rows not read; run at
    once outside a pipeline."""
    _queue(conn, statement, params)


def read_row(
    conn: Connection[Any],
    statement: LiteralString | Numbered,
    params: Mapping[str, Any],
    make_row: RowMakerFor[R],
) -> R | None:
    """``statement``'s first row with ``params`` (by name), made by ``make_row(result)``'s row maker; None
    when it returns no row. In a pipeline, what was queued before it is sent with it and read first."""
    result = _read(conn, statement, params)
    if result is None or result.ntuples == 0:
        return None
    transformer = _state(conn).transformer
    transformer.set_pgresult(result)
    return transformer.load_row(0, make_row(result))


def read_rows(
    conn: Connection[Any],
    statement: LiteralString | Numbered,
    params: Mapping[str, Any],
    make_row: RowMakerFor[R],
) -> list[R]:
    """:func:`read_row`, every row."""
    result = _read(conn, statement, params)
    if result is None or result.ntuples == 0:
        return []
    transformer = _state(conn).transformer
    transformer.set_pgresult(result)
    return transformer.load_rows(0, result.ntuples, make_row(result))


def _read(
    conn: Connection[Any], statement: LiteralString | Numbered, params: Mapping[str, Any]
) -> PGresult | None:
    """``statement``'s result: queued and read back with what was queued before it, in a pipeline; run at
    once outside one."""
    pipeline = conn._pipeline
    if pipeline is None:
        return _run_now(conn, statement, params)
    slot = _queue(conn, statement, params)
    assert slot is not None
    with conn.lock:
        while slot.result is None:
            conn.wait(pipeline._fetch_gen(flush=True))
    return slot.result


def _queue(
    conn: Connection[Any], statement: LiteralString | Numbered, params: Mapping[str, Any]
) -> Queued | None:
    """``statement`` with ``params`` queued, prepared as psycopg's cursors are (by the connection's own
    preparation cache, at first use): its place in the result queue; run through a raw cursor outside a
    pipeline (None then)."""
    pipeline = conn._pipeline
    if pipeline is None:
        _run_now(conn, statement, params)
        return None
    query, text = _numbered(statement)
    values = query.values(params)
    state = _state(conn)
    transformer = state.transformer
    pgconn = conn.pgconn
    cache = conn._prepared
    with conn.lock:
        dumped = transformer.dump_sequence(values, [PyFormat.AUTO] * len(values))
        types, formats = transformer.types, transformer.formats
        assert types is not None and formats is not None  # set by the dump
        key = _Statement(text, types)
        if cache._to_flush:  # what the cache let go of is deallocated first (in the pipeline)
            conn.wait(cache.maintain_gen(conn))
        prepare, name = cache.get(key, prepare=True)  # type: ignore[arg-type]  # its query and types
        if prepare is Prepare.NO:  # the connection prepares nothing (prepare_threshold None)
            pipeline.command_queue.append(
                partial(pgconn.send_query_params, text, dumped, param_types=types, param_formats=formats)
            )
        else:
            if prepare is Prepare.SHOULD:
                pipeline.command_queue.append(partial(pgconn.send_prepare, name, text, param_types=types))
                pipeline.result_queue.append(None)
            pipeline.command_queue.append(
                partial(pgconn.send_query_prepared, name, dumped, param_formats=formats)
            )
        added = cache.maybe_add_to_cache(key, prepare, name)  # type: ignore[arg-type]
        slot = Queued(conn, state.encoding)
        pipeline.result_queue.append((slot, (added, prepare, name) if added is not None else None))  # type: ignore[arg-type]
        hand_over(pipeline)
    return slot


def _run_now(
    conn: Connection[Any], statement: LiteralString | Numbered, params: Mapping[str, Any]
) -> PGresult | None:
    """``statement`` run at once through a raw cursor (outside a pipeline): its result."""
    query, _ = _numbered(statement)
    with RawCursor(conn) as cur:
        cur.execute(query.text, query.values(params))
        return cur.pgresult


def hand_over(pipeline: Pipeline) -> None:
    """What the pipeline queued handed to libpq, in order, which holds it in its buffer (in pipeline mode it
    writes only past its threshold, 64 kB, without waiting): written when a result is read or at the
    pipeline's end, as a buffered pipeline does (:func:`~libs.common.core.db.buffered_pipeline`)."""
    queue = pipeline.command_queue
    while queue:
        queue.popleft()()
