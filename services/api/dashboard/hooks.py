"""What runs around every dashboard handler: the session and CSRF check before it, errors as pages after.

Before a handler runs (:func:`before_request`): the session cookie is verified; a page that needs a session
redirects a browser without one to the sign-in page; every POST must carry the CSRF token of its session
(403 otherwise); the posted form is read once and kept for the handler (:class:`forms.Form`).

Errors the handlers do not turn into a form's field errors are pages with the API's statuses: another
project's ids are 404 like unknown ones, a conflict is 409, a refused value 422 (one table for both:
:data:`services.api.problems.STATUS_OF`, titled as the API titles its problems).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.types import ExceptionHandlersMap

from libs.common.core.errors import FollowupsError
from services.api.dashboard.render import dashboard_of, page
from services.api.dashboard.session import CSRF_COOKIE, CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE
from services.api.problems import status_of, title_of

log = logging.getLogger(__name__)

#: A handler with ``opt={"public": True}`` is served without a session (the sign-in page).
PUBLIC = {"public": True}


async def before_request(request: Request[Any, Any, Any]) -> Response[Any] | None:
    signer = dashboard_of(request)
    session = signer.session_from(request.cookies.get(SESSION_COOKIE))
    request.state.dashboard_session = session
    request.state.dashboard_nonce = session.nonce if session else request.cookies.get(CSRF_COOKIE)
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
        token = form.get(CSRF_FIELD)
        token = token if isinstance(token, str) else request.headers.get(CSRF_HEADER)
        if not signer.csrf_valid(request.state.dashboard_nonce, token):
            log.warning(
                "dashboard request refused: CSRF token missing or wrong", extra={"path": request.url.path}
            )
            return error_page(
                request,
                403,
                "This form has expired or did not come from this dashboard. Reload it and retry.",
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
