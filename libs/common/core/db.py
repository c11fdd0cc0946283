"""PostgreSQL access: the connection pool and error mapping at the database boundary."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import psycopg
from psycopg import errors as pgerrors
from psycopg_pool import ConnectionPool

from libs.common.core.errors import DatabaseUnavailable, FollowupsError
from libs.common.core.settings import DatabaseSettings

log = logging.getLogger(__name__)

#: Maps a constraint name to the domain error its violation means.
ConstraintErrors = Mapping[str, Callable[[], FollowupsError]]


def create_pool(settings: DatabaseSettings, *, name: str = "followups", open_: bool = True) -> ConnectionPool:
    """A psycopg pool; connections are in transaction mode (``with pool.connection()`` commits)."""
    pool = ConnectionPool(
        settings.url,
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        name=name,
        open=False,
        kwargs={"application_name": name},
    )
    if open_:
        pool.open(wait=True, timeout=30)
    return pool


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
    except psycopg.OperationalError as exc:
        log.warning("database unavailable: %s", exc)
        raise DatabaseUnavailable() from exc
