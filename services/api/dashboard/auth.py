"""Signing in with a project API key, and out."""

from __future__ import annotations

import secrets
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath

from libs.common.core.errors import Unauthorized
from libs.common.platform.projects import authenticate
from services.api.dashboard.base import see_other
from services.api.dashboard.forms import Form, FormErrors
from services.api.dashboard.hooks import PUBLIC
from services.api.dashboard.queries import project_header
from services.api.dashboard.render import dashboard_of, page, session_of
from services.api.dashboard.session import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    csrf_cookie,
    expire,
    new_session,
    session_cookie,
)
from services.api.deps import runtime_of, transaction


def _next(raw: str | None) -> str:
    """Where to go after signing in: a dashboard page, never another site (``//evil``, ``/\\evil``)."""
    if raw and raw.startswith("/app/") and "//" not in raw and "\\" not in raw:
        return raw
    return "/app/"


class AuthController(Controller):
    path = "/"

    @get("/", sync_to_thread=False)
    def home(self) -> Response[str]:
        return see_other("/app/sequences")

    @get("/{rest:path}", sync_to_thread=False)
    def unknown(self, rest: FromPath[str]) -> Response[str]:
        """Any other address under /app/ (an id that is not one, a page that does not exist): 404."""
        raise NotFoundException()

    @get("/sign-in", opt=PUBLIC, sync_to_thread=False)
    def sign_in_form(self, request: Request[Any, Any, Any]) -> Response[str]:
        fresh = None
        if session_of(request) is None and not request.state.get("dashboard_nonce"):
            fresh = secrets.token_urlsafe(16)
            request.state.dashboard_nonce = fresh
        response = page(request, "sign_in.html", next=_next(request.query_params.get("next")))
        if fresh is not None:
            response.set_cookie(csrf_cookie(request, fresh))
        return response

    @post("/sign-in", opt=PUBLIC, sync_to_thread=True)
    def sign_in(self, request: Request[Any, Any, Any]) -> Response[str]:
        form = Form.of(request)
        key = form.get("api_key").strip()
        target = _next(form.get("next"))
        try:
            if not key:
                raise Unauthorized("Enter the project's API key.", field="api_key")
            with transaction(runtime_of(request)) as conn:
                project_id = authenticate(conn, key)
                header = project_header(conn, project_id)
        except Unauthorized as exc:
            errors = FormErrors()
            errors.add(
                "api_key",
                exc.message
                if exc.field
                else "This API key is not valid: check that it was copied whole and was not revoked.",
            )
            return page(request, "sign_in.html", status=401, errors=errors, next=target)
        response = see_other(target)
        response.set_cookie(
            session_cookie(request, dashboard_of(request), new_session(project_id, header.name))
        )
        expire(response, CSRF_COOKIE)
        return response

    @post("/sign-out", sync_to_thread=False)
    def sign_out(self) -> Response[str]:
        response = see_other("/app/sign-in", notice="signed_out")
        expire(response, SESSION_COOKIE)
        return response
