"""What the dashboard's page handlers share: the signed-in project, redirects after a POST, lists' pages."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

from litestar import Request, Response

from services.api.dashboard.render import session_of

T = TypeVar("T")

#: Rows of a list page.
PAGE_SIZE = 50


def project_of(request: Request[Any, Any, Any]) -> uuid.UUID:
    """The signed-in project (the request hook has redirected a browser without a session)."""
    session = session_of(request)
    assert session is not None, "a dashboard page ran without a session"
    return session.project_id


def see_other(path: str, **query: str | None) -> Response[str]:
    """The answer to a successful POST: 303 to the page that shows its result."""
    params = {key: value for key, value in query.items() if value is not None}
    location = f"{path}?{urlencode(params)}" if params else path
    return Response("", status_code=303, headers={"Location": location})


def paged(rows: Sequence[T], limit: int = PAGE_SIZE) -> tuple[list[T], str | None]:
    """Up to ``limit`` rows of ``limit + 1`` fetched, and the cursor of the next page (None: the last)."""
    items = list(rows[:limit])
    cursor = str(getattr(items[-1], "id")) if len(rows) > limit and items else None  # noqa: B009
    return items, cursor


def query_uuid(request: Request[Any, Any, Any], name: str) -> uuid.UUID | None:
    """A query parameter holding an id (None when absent or not an id)."""
    raw = request.query_params.get(name) or ""
    try:
        return uuid.UUID(raw) if raw else None
    except ValueError:
        return None
