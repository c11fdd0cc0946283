"""The dashboard's session and its CSRF tokens.

Signing in checks a project API key with :func:`libs.common.platform.api_keys.authenticate` and starts a
session on the server (:mod:`libs.common.platform.sessions`: a row with the key it signed in with). The
:data:`SESSION_COOKIE` carries only the session's opaque random token (the server stores its SHA-256).
Every request looks the session up: a token that is unknown, signed out, past its lifetime
(``DASHBOARD_SESSION_SECONDS``) or whose key was revoked or expired is no session. The cookie is
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it), ``Path=/app`` and
``Secure`` over HTTPS. It carries no API key: a stolen cookie opens the dashboard until the session ends,
never the REST API.

CSRF tokens are signed double-submit tokens bound to the session: every form carries ``_csrf``, the HMAC of
the session's token (before signing in: of :data:`CSRF_COOKIE`'s nonce, which ``GET /app/sign-in`` draws
anew every time: a nonce a browser brings along is never reused), and every POST is refused with 403 unless
its token matches and, when the browser says where the form came from (``Origin``, ``Sec-Fetch-Site``), it
came from this dashboard. A token cannot be computed without the secret, and a token of one session is
worth nothing in another.

**The secret** comes from ``DASHBOARD_SECRET`` (at least 32 characters), read once when the app is built.
Every API process behind one address must share it, or a form rendered by one is refused by the next. When
it is unset, each process draws a random secret at start: right for ``followups dev`` (one process), wrong
for several API replicas.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response
from litestar.datastructures import Cookie

from libs.common.core.settings import ApiSettings, load
from libs.common.platform.api_keys import Scope

#: The session cookie: the session's opaque token.
SESSION_COOKIE = "followups_session"
#: Before signing in: the nonce the sign-in form's CSRF token is bound to.
CSRF_COOKIE = "followups_csrf"
#: Where the cookies are sent: the dashboard only.
COOKIE_PATH = "/app"
#: The form field and the header a CSRF token travels in.
CSRF_FIELD = "_csrf"
CSRF_HEADER = "x-csrf-token"


def secret_from_environment(environ: dict[str, str] | None = None) -> bytes:
    """The secret from ``DASHBOARD_SECRET`` (checked by the settings: 32 characters or more), else a random
    one for this process only (see the module)."""
    configured = load(ApiSettings, environ).dashboard_secret
    return configured.encode() if configured else secrets.token_bytes(32)


@dataclass(frozen=True)
class Session:
    """A signed-in browser: the project it sees, its key's scope, and the session's token (its cookie's
    value, which its CSRF tokens are bound to)."""

    project_id: uuid.UUID
    token: str
    scope: Scope
    #: The project's name, for the header.
    project_name: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Signer:
    """Signs and verifies CSRF tokens under one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def csrf_token(self, nonce: str) -> str:
        return _b64(hmac.new(self._secret, f"csrf\n{nonce}".encode(), hashlib.sha256).digest())

    def csrf_valid(self, nonce: str | None, token: str | None) -> bool:
        if not nonce or not token:
            return False
        return hmac.compare_digest(token, self.csrf_token(nonce))


def new_nonce() -> str:
    """A fresh nonce for the sign-in form's CSRF token."""
    return secrets.token_urlsafe(16)


def _secure(request: Request[Any, Any, Any]) -> bool:
    return request.url.scheme == "https"


def session_cookie(request: Request[Any, Any, Any], token: str, max_age: int) -> Cookie:
    return Cookie(
        key=SESSION_COOKIE,
        value=token,
        path=COOKIE_PATH,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )


def csrf_cookie(request: Request[Any, Any, Any], nonce: str) -> Cookie:
    return Cookie(
        key=CSRF_COOKIE,
        value=nonce,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )


def expire(response: Response[Any], key: str) -> None:
    """Tell the browser to forget a dashboard cookie."""
    response.delete_cookie(key, path=COOKIE_PATH)
