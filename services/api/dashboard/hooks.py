"""What runs around every dashboard handler: the session and CSRF check before it, errors as pages after.

Before a handler runs (:func:`before_request`): the session is looked up on the server; a page that needs a
session redirects a browser without one to the sign-in page; every POST must come from this dashboard (a
browser's ``Sec-Fetch-Site`` / ``Origin``) and carry the CSRF token of its session (403 otherwise); a page
needs the scope its method or its ``opt`` says (:func:`services.api.scopes.needed_scope`: GET ``read``,
POST ``write``), granted by the scope of the key the session signed in with (403 otherwise); the posted
form is read once and kept for the handler (:class:`forms.Form`).

Errors the handlers do not turn into a form's field errors are pages with the API's statuses: another
project's ids are 404 like unknown ones, a conflict is 409, a refused value 422 (one table for both:
:data:`services.api.problems.STATUS_OF`, titled as the API titles its problems).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote, urlsplit

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.types import ExceptionHandlersMap

from libs.common.core.errors import FollowupsError
from libs.common.platform import sessions
from libs.common.platform.api_keys import allows
from services.api.dashboard.render import dashboard_of, page
from services.api.dashboard.session import (
    CSRF_COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    SESSION_COOKIE,
    Session,
)
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of, title_of
from services.api.scopes import needed_scope

log = logging.getLogger(__name__)

#: A handler with ``opt={"public": True}`` is served without a session (the sign-in page).
PUBLIC = {"public": True}


def _session(request: Request[Any, Any, Any], token: str) -> Session | None:
    """The live session of the cookie's token (see :mod:`.session`)."""
    runtime = runtime_of(request)
    with transaction(runtime) as conn:
        found = sessions.session_for(conn, token, now=runtime.clock.now())
    return Session(found.project_id, token, found.scope, found.project_name) if found else None


def _cross_site(request: Request[Any, Any, Any]) -> bool:
    """Whether the browser says the request comes from another site's page: ``Sec-Fetch-Site`` (every
    current browser sends it), else ``Origin`` compared with the ``Host`` the browser addressed."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc != request.headers.get("host", "")


async def before_request(request: Request[Any, Any, Any]) -> Response[Any] | None:
    signer = dashboard_of(request)
    token = request.cookies.get(SESSION_COOKIE)
    # a database lookup: in the request threads (API_THREADS), not on the event loop
    session = await asyncio.to_thread(_session, request, token) if token else None
    request.state.dashboard_session = session
    request.state.dashboard_nonce = session.token if session else request.cookies.get(CSRF_COOKIE)
    if session is None and not request.route_handler.opt.get("public"):
        target = "/app/"
        if request.method == "GET":
            query = request.url.query
            target = request.url.path + (f"?{query}" if query else "")
        return Response(
            "", status_code=303, headers={"Location": f"/app/sign-in?next={quote(target, safe='/')}"}
        )
    if request.method == "POST":
        form = await request.form()
        request.state.dashboard_form = form
        csrf = form.get(CSRF_FIELD)
        csrf = csrf if isinstance(csrf, str) else request.headers.get(CSRF_HEADER)
        if _cross_site(request) or not signer.csrf_valid(request.state.dashboard_nonce, csrf):
            log.warning(
                "dashboard request refused: CSRF token missing or wrong, or posted from another site",
                extra={"path": request.url.path},
            )
            return error_page(
                request,
                403,
                "This form has expired or did not come from this dashboard. Reload it and retry.",
            )
    if session is not None and not request.route_handler.opt.get("public"):
        needed = needed_scope(request.route_handler, request.method)
        if not allows(session.scope, needed):
            log.info(
                "dashboard request refused: scope",
                extra={
                    "project_id": str(session.project_id),
                    "scope": session.scope,
                    "path": request.url.path,
                },
            )
            return error_page(
                request,
                403,
                f"This needs an API key with the `{needed}` scope: you signed in with a `{session.scope}`"
                " key.",
            )
    return None


def error_page(request: Request[Any, Any, Any], status: int, message: str) -> Response[str]:
    return page(request, "error.html", status=status, title=title_of(status), message=message)


def _domain_error(request: Request[Any, Any, Any], exc: FollowupsError) -> Response[str]:
    status = status_of(exc)
    message = "Nothing like this exists in this project." if status == 404 else exc.message
    return error_page(request, status, message)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[str]:
    message = "Nothing like this exists in this project." if exc.status_code == 404 else str(exc.detail)
    return error_page(request, exc.status_code, message)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[str]:
    log.exception("dashboard: unhandled error", extra={"path": request.url.path, "method": request.method})
    return error_page(request, 500, "An unexpected error occurred; it has been logged.")


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    FollowupsError: _domain_error,
    HTTPException: _http_error,
    Exception: _unexpected,
}
