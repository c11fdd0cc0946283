"""The dashboard's session and its CSRF tokens: signed cookies, no server-side session store.

Signing in checks a project API key with :func:`libs.common.platform.projects.authenticate` and sets
:data:`SESSION_COOKIE`: the project's id, a random session nonce and an expiry, signed with HMAC-SHA256
under the dashboard secret (:class:`Signer`). Every request verifies the signature and the expiry on the
server; a cookie that was changed, forged under another secret or has expired is no session. The cookie is
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it), ``Path=/app`` and
``Secure`` over HTTPS. It carries no API key: a stolen cookie opens the dashboard until it expires
(:data:`SESSION_SECONDS`), never the REST API.

CSRF tokens are signed double-submit tokens bound to the session: every form carries ``_csrf``, the HMAC of
the session's nonce (before signing in: of :data:`CSRF_COOKIE`'s nonce), and every POST is refused with 403
unless its token matches. A token cannot be computed without the secret, so a cookie planted by another
site (or subdomain) does not help forge one, and a token of one session is worth nothing in another.

**The secret** comes from ``DASHBOARD_SECRET`` (at least 32 characters), read once when the app is built.
Every API process behind one address must share it, or a session signed by one is refused by the next. When
it is unset, each process draws a random secret at start: right for ``followups dev`` (one process; a
restart signs you out, and ``.followups/api_key`` signs you in again), wrong for several API replicas.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response
from litestar.datastructures import Cookie

from libs.common.core.settings import ApiSettings, load

#: How long a session lasts after signing in (then the dashboard asks for the key again).
SESSION_SECONDS = 12 * 3600
#: The session cookie: the signed project id, nonce and expiry.
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
    """A signed-in browser: the project it sees, and the nonce its CSRF tokens are bound to."""

    project_id: uuid.UUID
    nonce: str
    expires_at: int
    #: The project's name, for the header.
    project_name: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs and verifies session cookies and CSRF tokens under one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, purpose: str, message: str) -> str:
        return _b64(hmac.new(self._secret, f"{purpose}\n{message}".encode(), hashlib.sha256).digest())

    def session_cookie_value(self, session: Session) -> str:
        payload = _b64(
            json.dumps(
                {
                    "p": str(session.project_id),
                    "n": session.nonce,
                    "e": session.expires_at,
                    "t": session.project_name,
                },
                separators=(",", ":"),
            ).encode()
        )
        return f"{payload}.{self._mac('session', payload)}"

    def session_from(self, value: str | None, *, now: float | None = None) -> Session | None:
        """The session a cookie value carries, or None when it is missing, altered or expired."""
        if not value or value.count(".") != 1:
            return None
        payload, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac("session", payload)):
            return None
        try:
            data = json.loads(_unb64(payload))
            session = Session(uuid.UUID(data["p"]), str(data["n"]), int(data["e"]), str(data.get("t", "")))
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.expires_at > (time.time() if now is None else now) else None

    def csrf_token(self, nonce: str) -> str:
        return self._mac("csrf", nonce)

    def csrf_valid(self, nonce: str | None, token: str | None) -> bool:
        if not nonce or not token:
            return False
        return hmac.compare_digest(token, self.csrf_token(nonce))


def new_session(project_id: uuid.UUID, project_name: str) -> Session:
    return Session(project_id, secrets.token_urlsafe(16), int(time.time()) + SESSION_SECONDS, project_name)


def _secure(request: Request[Any, Any, Any]) -> bool:
    return request.url.scheme == "https"


def session_cookie(request: Request[Any, Any, Any], signer: Signer, session: Session) -> Cookie:
    return Cookie(
        key=SESSION_COOKIE,
        value=signer.session_cookie_value(session),
        path=COOKIE_PATH,
        max_age=SESSION_SECONDS,
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
