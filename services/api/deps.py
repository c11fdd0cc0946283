"""What every route handler needs: the runtime, a transaction, and the caller's project."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, Protocol

from litestar import Request
from litestar.di import NamedDependency
from litestar.params import QueryParameter
from psycopg import Connection

from libs.common.contracts import actors
from libs.common.core import broker
from libs.common.core.db import map_errors
from libs.common.core.errors import Unauthorized
from libs.common.core.runtime import Runtime
from libs.common.platform.projects import authenticate

log = logging.getLogger(__name__)


def runtime_of(request: Request[Any, Any, Any]) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


@contextmanager
def transaction(runtime: Runtime) -> Iterator[Connection[Any]]:
    """One database transaction: committed when the block ends, rolled back on an error."""
    with map_errors(), runtime.pool.connection() as conn:
        yield conn


#: A list handler's ``limit`` query parameter: 1 to 500 items a page.
PageLimit = Annotated[int, QueryParameter(ge=1, le=500)]

#: A handler parameter ``project_id: ProjectId`` receives the caller's project (see :func:`project_id`).
ProjectId = NamedDependency[uuid.UUID]


def project_id(request: Request[Any, Any, Any]) -> uuid.UUID:
    """The project of the request's bearer API key (401 without a valid one)."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized()
    with transaction(runtime_of(request)) as conn:
        return authenticate(conn, key.strip())


def nudge_release(runtime: Runtime, project: uuid.UUID, enrollment_id: uuid.UUID) -> None:
    """Wake a release worker now, without waiting on RabbitMQ: the nudge is queued for this process's
    sender thread, or dropped and counted (a lost nudge only costs latency: the loops poll)."""
    broker.nudge(
        runtime.broker,
        actors.RELEASE_NUDGE,
        actors.ReleaseNudge(project_id=project, enrollment_id=enrollment_id),
    )


def nudge_triggers(runtime: Runtime, project: uuid.UUID) -> None:
    """Wake the triggers service now (rules may have triggers to act on), without waiting on RabbitMQ; a
    lost nudge costs latency only."""
    broker.nudge(runtime.broker, actors.TRIGGERS_NUDGE, actors.TriggersNudge(project_id=project))


class _HasId(Protocol):
    @property
    def id(self) -> uuid.UUID: ...


def page(rows: Sequence[_HasId], limit: int) -> dict[str, Any]:
    """A list response from up to ``limit + 1`` rows: the extra row only tells that a next page exists."""
    items = list(rows[:limit])
    return {"items": items, "next": str(items[-1].id) if len(rows) > limit else None}
