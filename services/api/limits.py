"""Throttling: failed sign-ins and failed bearer keys per client address, and requests per API key.

Three limits, each a rate of N a minute in bursts of up to N (a generic cell rate algorithm: one number
per address or key, the time its allowance is used up to):

- ``signin_failures``: failed ``POST /app/sign-in`` (any answer of 400 or more) per client address
  (``API_SIGNIN_FAILURES_PER_MINUTE``); beyond, that address's sign-ins are 429;
- ``auth_failures``: requests outside the dashboard that carried an ``Authorization`` header and were
  answered 401, per client address (``API_AUTH_FAILURES_PER_MINUTE``); beyond, that address's requests
  with an ``Authorization`` header are 429 (a right key too: the address is guessing);
- ``key_requests``: every request outside the dashboard with a bearer token, keyed by the token's SHA-256
  (never the key itself), ``API_KEY_REQUESTS_PER_MINUTE`` (0: none).

A failure is observed from the answer (``before_send``), not from how authentication decided it: what
counts is a 401 that was sent. The check runs before the handler and its dependencies
(:func:`middleware`): a throttled request costs no database work. Every refusal is a 429 problem with
``Retry-After`` (whole seconds until one more is allowed), counted in ``followups_api_throttled_total``.

The client address is the socket's peer as uvicorn gives it (``X-Forwarded-For`` only from
``API_TRUSTED_PROXIES``: :mod:`services.api.server`). State is per API process, in its event loop (no
lock), and bounded: each table holds at most ``API_LIMITER_MAX_ENTRIES`` addresses or keys and forgets the
least recently charged first, so random keys or addresses cannot grow it. It belongs to the runtime it
serves: an app given another runtime (each test's) starts with empty tables.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from libs.common.core import metrics
from libs.common.core.runtime import Runtime
from libs.common.core.settings import ApiSettings
from services.api.problems import PROBLEM_JSON, problem_body

log = logging.getLogger(__name__)

SIGN_IN_PATH = "/app/sign-in"
DASHBOARD_PREFIX = "/app/"

#: The limits' names, as the metric's ``limit`` label and the 429's text name them.
SIGNIN_FAILURES, AUTH_FAILURES, KEY_REQUESTS = "signin_failures", "auth_failures", "key_requests"

_PERIOD = 60.0


class Rate:
    """At most ``per_minute`` charges a minute per key, in bursts of up to as many; at most
    ``max_entries`` keys remembered (the least recently charged is forgotten first)."""

    def __init__(self, per_minute: int, max_entries: int) -> None:
        self.interval = _PERIOD / per_minute
        self.max_entries = max_entries
        #: key -> the time its allowance is used up to (only ever moves forward)
        self._until: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._until)

    def wait(self, key: str, now: float) -> float:
        """Seconds until ``key`` may be charged once more (0: now)."""
        until = self._until.get(key)
        return 0.0 if until is None else max(0.0, until + self.interval - now - _PERIOD)

    def charge(self, key: str, now: float) -> None:
        """Count one for ``key`` (the caller checked :meth:`wait`, or charges a failure that happened)."""
        until = max(self._until.pop(key, now), now) + self.interval
        self._until[key] = until
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)

    def take(self, key: str, now: float) -> float:
        """Charge ``key`` when it may be charged now; else the seconds to wait (and nothing charged)."""
        wait = self.wait(key, now)
        if wait == 0.0:
            self.charge(key, now)
        return wait


@dataclass
class _Tables:
    runtime: Runtime
    signin_failures: Rate
    auth_failures: Rate
    key_requests: Rate | None

    @classmethod
    def of(cls, runtime: Runtime) -> _Tables:
        api: ApiSettings = runtime.settings.api
        size = api.limiter_max_entries
        return cls(
            runtime,
            Rate(api.signin_failures_per_minute, size),
            Rate(api.auth_failures_per_minute, size),
            Rate(api.key_requests_per_minute, size) if api.key_requests_per_minute else None,
        )


class Limits:
    """The limiter of one API app (kept in its state as ``limits``).

    It paces by ``timer`` (seconds), the process's monotonic clock by default: a limit is about how fast
    requests really come, not about the runtime's clock of due times, which tests and simulations move
    back and forth."""

    def __init__(self, timer: Callable[[], float] = time.monotonic) -> None:
        self._tables: _Tables | None = None
        self._timer = timer

    def tables(self, runtime: Runtime) -> _Tables:
        if self._tables is None or self._tables.runtime is not runtime:
            self._tables = _Tables.of(runtime)
        return self._tables

    def refusal(self, scope: Scope) -> tuple[str, float] | None:
        """The limit a request is over and the seconds to wait, or None (a key's request then counted)."""
        tables = self.tables(_runtime_of(scope))
        now, request = self._timer(), _Request.of(scope)
        if request.signs_in:
            wait = tables.signin_failures.wait(request.client, now)
            return (SIGNIN_FAILURES, wait) if wait else None
        if request.dashboard or request.authorization is None:
            return None
        wait = tables.auth_failures.wait(request.client, now)
        if wait:
            return AUTH_FAILURES, wait
        token = request.bearer_token
        if token is not None and tables.key_requests is not None:
            wait = tables.key_requests.take(hashlib.sha256(token).hexdigest(), now)
            if wait:
                return KEY_REQUESTS, wait
        return None

    def observe(self, scope: Scope, status: int) -> None:
        """Count a failure of the request's client address from the status it was answered."""
        if status < 400 or status == 429:
            return
        request = _Request.of(scope)
        if request.signs_in:
            self._fail(SIGNIN_FAILURES, scope, request.client)
        elif status == 401 and not request.dashboard and request.authorization is not None:
            self._fail(AUTH_FAILURES, scope, request.client)

    def _fail(self, limit: str, scope: Scope, client: str) -> None:
        tables = self.tables(_runtime_of(scope))
        rate: Rate = getattr(tables, limit)
        now = self._timer()
        was_free = rate.wait(client, now) == 0.0
        rate.charge(client, now)
        if was_free and rate.wait(client, now) > 0.0:
            log.warning("client address throttled", extra={"limit": limit, "client": client})


@dataclass(frozen=True)
class _Request:
    client: str
    method: str
    path: str
    authorization: bytes | None

    @classmethod
    def of(cls, scope: Scope) -> _Request:
        client = scope.get("client")
        authorization = next((v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"), None)
        return cls(
            client=str(client[0]) if client else "unknown",
            method=str(scope.get("method", "")),
            path=str(scope.get("path", "")),
            authorization=authorization,
        )

    @property
    def signs_in(self) -> bool:
        return self.method == "POST" and self.path == SIGN_IN_PATH

    @property
    def dashboard(self) -> bool:
        return self.path.startswith(DASHBOARD_PREFIX)

    @property
    def bearer_token(self) -> bytes | None:
        if self.authorization is None:
            return None
        scheme, _, token = self.authorization.partition(b" ")
        token = token.strip()
        return token if scheme.lower() == b"bearer" and token else None


def _runtime_of(scope: Scope) -> Runtime:
    runtime: Runtime = scope["app"].state.runtime
    return runtime


def _limits_of(scope: Scope) -> Limits:
    limits: Limits = scope["app"].state.limits
    return limits


def retry_after(wait: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait)))


def middleware(app: ASGIApp) -> ASGIApp:
    """Refuse a request over a limit with 429, before its handler and dependencies run.

    The problem is sent here, not raised: the dashboard's error pages would render it as HTML, and every
    429 is the same problem body, for a browser's sign-in as for a REST client."""

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            refused = _limits_of(scope).refusal(scope)
            if refused is not None:
                limit, wait = refused
                metrics.API_THROTTLED.labels(limit=limit).inc()
                seconds = retry_after(wait)
                detail = f"too many requests ({limit.replace('_', ' ')}): retry after {seconds} seconds"
                body = msgspec.json.encode(problem_body(429, detail))
                headers = [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", seconds.encode()),
                ]
                await send({"type": "http.response.start", "status": 429, "headers": headers})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
        await app(scope, receive, send)

    return limited


async def observe(message: Message, scope: Scope) -> None:
    """``before_send``: count the failure an answer tells (a 401, a refused sign-in)."""
    if message["type"] == "http.response.start" and scope.get("type") == ScopeType.HTTP:
        _limits_of(scope).observe(scope, int(message["status"]))


def state() -> dict[str, Any]:
    """What :func:`services.api.app.create_app` adds to the app's state."""
    return {"limits": Limits()}
