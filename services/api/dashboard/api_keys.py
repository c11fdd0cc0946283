"""API keys: the list (never the keys themselves), a new key (shown once, on the page that created it) and
revoking one. Admin sessions only (the controller's scope), the same domain functions as ``/v1/api-keys``."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath

from libs.common.core.errors import FollowupsError
from libs.common.platform import api_keys
from libs.common.platform.api_keys import SCOPES, ApiKeyCreate, NewApiKey
from services.api.dashboard.base import paged, project_of, query_uuid, see_other
from services.api.dashboard.forms import Form, FormErrors, anchor_time, error_of, validation_error
from services.api.dashboard.render import page
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of
from services.api.scopes import scope

#: The scope choices of the form, each with what it allows (docs/api.md, Scopes).
SCOPE_CHOICES = [
    ("write", "write: all but keys"),
    ("read", "read: reads only"),
    ("events", "events: events, send lane"),
    ("admin", "admin: everything"),
]
assert [value for value, _ in sorted(SCOPE_CHOICES)] == sorted(SCOPES)

_EMPTY = {"name": "", "scope": "write", "expires_at": ""}


class ApiKeysController(Controller):
    path = "/api-keys"
    opt = scope("admin")

    @get("/", sync_to_thread=True)
    def list(self, request: Request[Any, Any, Any]) -> Response[str]:
        return self._list(request, FormErrors(), dict(_EMPTY))

    def _list(
        self,
        request: Request[Any, Any, Any],
        errors: FormErrors,
        values: dict[str, str],
        status: int = 200,
        created: NewApiKey | None = None,
    ) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            rows = api_keys.list_keys(conn, project_of(request), limit=51, after=query_uuid(request, "after"))
        items, cursor = paged(rows)
        return page(
            request,
            "api_keys/list.html",
            status=status,
            title="API keys",
            keys=items,
            cursor=cursor,
            errors=errors,
            values=values,
            scope_choices=SCOPE_CHOICES,
            created=created,
            headers={"Cache-Control": "no-store"},  # a new key is on the page: not kept by the browser
        )

    @post("/new", sync_to_thread=True)
    def create(self, request: Request[Any, Any, Any]) -> Response[str]:
        form = Form.of(request)
        values = {name: form.get(name) for name in _EMPTY}
        errors = FormErrors()
        expires_at = anchor_time(values["expires_at"], errors, "expires_at", what="the expiry")
        if errors:
            return self._list(request, errors, values, 422)
        runtime = runtime_of(request)
        payload = {"name": values["name"], "scope": values["scope"], "expires_at": expires_at}
        try:
            data = msgspec.convert(payload, ApiKeyCreate)
            with transaction(runtime) as conn:
                created = api_keys.create_key(conn, project_of(request), data, now=runtime.clock.now())
        except msgspec.ValidationError as exc:
            return self._list(request, validation_error(exc), values, 422)
        except FollowupsError as exc:
            return self._list(request, error_of(exc), values, status_of(exc))
        return self._list(request, FormErrors(), dict(_EMPTY), 201, created=created)

    @post("/{key_id:uuid}/revoke", sync_to_thread=True)
    def revoke(self, request: Request[Any, Any, Any], key_id: FromPath[uuid.UUID]) -> Response[str]:
        runtime = runtime_of(request)
        try:
            with transaction(runtime) as conn:
                api_keys.revoke_key(conn, project_of(request), key_id, now=runtime.clock.now())
        except FollowupsError as exc:
            if status_of(exc) == 404:
                raise
            return self._list(request, error_of(exc), dict(_EMPTY), status_of(exc))
        return see_other("/app/api-keys", notice="revoked")
