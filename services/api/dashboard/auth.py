"""Signing in with a project API key, and out."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath

from libs.common.core.errors import Unauthorized
from libs.common.platform import sessions
from libs.common.platform.api_keys import allows, authenticate
from services.api.dashboard.base import see_other
from services.api.dashboard.forms import Form, FormErrors
from services.api.dashboard.hooks import PUBLIC
from services.api.dashboard.render import page, session_of
from services.api.dashboard.session import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    csrf_cookie,
    expire,
    new_nonce,
    session_cookie,
)
from services.api.deps import runtime_of, transaction
from services.api.scopes import scope

#: A ``next`` the sign-in goes to: a dashboard path of printable ASCII (no space, CR, LF or other control
#: character: it becomes a ``Location`` header).
_LOCAL_PATH = re.compile(r"/app/[!-~]*")


def _next(raw: str | None) -> str:
    """Where to go after signing in: a dashboard page, never another site (``//evil``, ``/\\evil``), never
    a header the server cannot send (CR, LF); anything else goes to ``/app/``."""
    if (
        raw
        and _LOCAL_PATH.fullmatch(raw)
        and "//" not in raw
        and "\\" not in raw
        and not {".", ".."} & set(urlsplit(raw).path.split("/"))
    ):
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
        """The form, with a token of a nonce drawn now: never of a nonce the browser brought along (a
        cookie another site may have planted)."""
        fresh = None
        if session_of(request) is None:
            fresh = new_nonce()
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
        runtime = runtime_of(request)
        lifetime = runtime.settings.api.dashboard_session_seconds
        try:
            if not key:
                raise Unauthorized("Enter the project's API key.", field="api_key")
            with transaction(runtime) as conn:
                now = runtime.clock.now()
                caller = authenticate(conn, key, now=now)
                if not allows(caller.scope, "read"):
                    raise Unauthorized(
                        f"A key of scope `{caller.scope}` cannot sign in: use a read, write or admin key.",
                        field="api_key",
                    )
                if (previous := session_of(request)) is not None:
                    sessions.end_session(conn, previous.token)
                token = sessions.start_session(conn, caller, now=now, lifetime_seconds=lifetime)
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
        response.set_cookie(session_cookie(request, token, lifetime))
        expire(response, CSRF_COOKIE)
        return response

    @post("/sign-out", opt=scope("read"), sync_to_thread=True)
    def sign_out(self, request: Request[Any, Any, Any]) -> Response[str]:
        """End the session on the server: its cookie opens nothing any more."""
        if (session := session_of(request)) is not None:
            with transaction(runtime_of(request)) as conn:
                sessions.end_session(conn, session.token)
        response = see_other("/app/sign-in", notice="signed_out")
        expire(response, SESSION_COOKIE)
        return response
