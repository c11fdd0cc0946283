"""The scope every ``/v1`` request needs, derived from its route: a new route cannot go without one.

A handler (or its controller) may declare its scope with ``opt=scope("admin")`` (the API keys),
``opt=scope("events")`` (the platform's events and the send lane); every other route needs ``read`` for
a GET and ``write`` for anything else. :func:`services.api.deps.project_id`, the dependency that
authenticates every ``/v1`` request, refuses a key whose scope does not grant it (403 naming the scope),
and :func:`check_routes` (run when the app is built, and by ``tests/test_api_keys.py``) refuses an app
with a ``/v1`` route that does not authenticate, declares an unknown scope, or needs ``read`` for a
method that changes something.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute

from libs.common.core.errors import Forbidden
from libs.common.platform.api_keys import SCOPES, Scope, allows

#: The handler option a route's scope is declared in.
SCOPE_OPT = "scope"
#: Methods that only read.
READING = frozenset({"GET", "HEAD"})


#: The handler option of a route a provider calls, authenticated by the provider's signature instead of an
#: API key (the webhooks of :mod:`services.api.routes.providers`).
SIGNED_OPT = "provider_signed"


def provider_signed() -> dict[str, Any]:
    """The ``opt`` of a route authenticated by a provider's signature, not an API key."""
    return {SIGNED_OPT: True}


def scope(needed: Scope) -> dict[str, Any]:
    """A route's (or controller's) ``opt`` declaring the scope it needs."""
    return {SCOPE_OPT: needed}


def needed_scope(handler: HTTPRouteHandler, method: str) -> Scope:
    """The scope a request to ``handler`` with ``method`` needs (see the module)."""
    declared: Scope | None = handler.opt.get(SCOPE_OPT)
    if declared is not None:
        return declared
    return "read" if method in READING else "write"


def require(granted: Scope, handler: HTTPRouteHandler, method: str) -> None:
    """Forbidden (403, naming the scope) unless a key of scope ``granted`` may make the request."""
    needed = needed_scope(handler, method)
    if not allows(granted, needed):
        raise Forbidden(
            f"this API key's scope `{granted}` does not allow this request: it needs the `{needed}` scope",
            field="scope",
        )


def check_routes(app: Litestar) -> dict[tuple[str, str], Scope]:
    """Every ``/v1`` operation and the scope it needs (a provider's signed webhook aside); raises
    RuntimeError for one that does not authenticate (takes no ``project_id``), declares an unknown scope, or
    is a change that needs only ``read``."""
    table: dict[tuple[str, str], Scope] = {}
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or not route.path.startswith("/v1"):
            continue
        for method, (handler, _) in route.route_handler_map.items():
            if method == "OPTIONS":
                continue
            where = f"{method} {route.path}"
            if handler.opt.get(SIGNED_OPT):
                continue  # the provider's signature authenticates it
            if "project_id" not in handler.parsed_fn_signature.parameters:
                raise RuntimeError(f"{where} does not authenticate: it must take project_id: ProjectId")
            needed = needed_scope(handler, method)
            if needed not in SCOPES:
                raise RuntimeError(f"{where} declares an unknown scope {needed!r}")
            if needed == "read" and method not in READING:
                raise RuntimeError(f"{where} changes something: it cannot need only the `read` scope")
            table[(method, route.path)] = needed
    return table
