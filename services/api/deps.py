"""What every route handler needs: the runtime, a transaction, and the caller's project."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any, Protocol

import msgspec
from litestar import Request
from litestar.di import NamedDependency
from litestar.params import QueryParameter
from psycopg import Connection

from libs.common.core import effects, metrics
from libs.common.core.db import map_errors
from libs.common.core.errors import Forbidden, InvalidInput, Unauthorized
from libs.common.core.runtime import Runtime
from libs.common.platform.api_keys import authenticate
from services.api import scopes

log = logging.getLogger(__name__)


def runtime_of(request: Request[Any, Any, Any]) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


@contextmanager
def transaction(runtime: Runtime) -> Iterator[Connection[Any]]:
    """One database transaction: committed when the block ends, rolled back on an error; the effects the
    domain functions registered (nudges, cache invalidations) run after the commit
    (:mod:`libs.common.core.effects`)."""
    with map_errors(), effects.transaction(runtime) as conn:
        yield conn


#: A list handler's ``limit`` query parameter: 1 to 500 items a page.
PageLimit = Annotated[int, QueryParameter(ge=1, le=500)]

#: A time query parameter (``created_after``): an RFC 3339 string, decoded by :func:`query_time` as strictly
#: as a body's time (the framework would read ``12345`` as seconds since 1970).
QueryTime = Annotated[
    str | None,
    QueryParameter(schema_extra={"oneOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]}),
]


def query_time(value: str | None, field: str) -> datetime | None:
    """A :data:`QueryTime` parameter's time (None when absent); anything but an RFC 3339 time is a 422
    naming ``field``."""
    if value is None:
        return None
    try:
        return msgspec.convert(value, datetime, strict=True)
    except msgspec.ValidationError:
        raise InvalidInput(
            f"{field} must be an RFC 3339 time such as 2030-01-07T09:00:00Z", field=field
        ) from None


#: A handler parameter ``project_id: ProjectId`` receives the caller's project (see :func:`project_id`).
ProjectId = NamedDependency[uuid.UUID]


def project_id(request: Request[Any, Any, Any]) -> uuid.UUID:
    """The project of the request's bearer API key: 401 without a valid one (unknown, revoked, expired),
    403 when the key's scope does not grant what the route needs (:mod:`services.api.scopes`)."""
    runtime = runtime_of(request)
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    try:
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized()
        with transaction(runtime) as conn:
            caller = authenticate(conn, key.strip(), now=runtime.clock.now())
    except Unauthorized:
        metrics.API_AUTH_REFUSALS.labels("unauthorized").inc()
        raise
    try:
        scopes.require(caller.scope, request.route_handler, request.method)
    except Forbidden:
        metrics.API_AUTH_REFUSALS.labels("missing_scope").inc()
        log.info(
            "request refused: scope",
            extra={
                "project_id": str(caller.project_id),
                "api_key_id": str(caller.key_id),
                "scope": caller.scope,
                "path": request.url.path,
                "method": request.method,
            },
        )
        raise
    return caller.project_id


class _HasId(Protocol):
    @property
    def id(self) -> uuid.UUID: ...


def page(rows: Sequence[_HasId], limit: int) -> dict[str, Any]:
    """A list response from up to ``limit + 1`` rows: the extra row only tells that a next page exists."""
    items = list(rows[:limit])
    return {"items": items, "next": items[-1].id if len(rows) > limit else None}


def query_phone(value: str | None) -> str | None:
    """A phone number from a query string: there a literal ``+`` is form encoding's space, so a leading space
    is read back as the ``+`` it was (``?phone=+14155550123`` finds what ``?phone=%2B14155550123`` finds)."""
    if value is not None and value.startswith(" "):
        return "+" + value[1:]
    return value
