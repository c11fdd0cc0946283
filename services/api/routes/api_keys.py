"""The project's API keys: create (the key is shown once), list, read, revoke. Admin keys only."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, FromQuery, JSONBody

from libs.common.platform import api_keys
from libs.common.platform.api_keys import ApiKey, ApiKeyCreate, NewApiKey
from services.api.deps import PageLimit, ProjectId, page, runtime_of, transaction
from services.api.openapi import conflict
from services.api.routes import Page, as_page
from services.api.scopes import scope


class ApiKeysController(Controller):
    path = "/v1/api-keys"
    tags = ["api keys"]
    opt = scope("admin")

    @post("/", sync_to_thread=True)
    def create(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[ApiKeyCreate]
    ) -> NewApiKey:
        """Create a key with a name, a scope and an optional expiry. ``api_key`` is in this answer only:
        the server keeps its SHA-256."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return api_keys.create_key(conn, project_id, data, now=runtime.clock.now())

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
    ) -> Page[ApiKey]:
        """A page of the project's keys, revoked and expired ones too (never the keys themselves)."""
        with transaction(runtime_of(request)) as conn:
            return as_page(page(api_keys.list_keys(conn, project_id, limit=limit + 1, after=after), limit))

    @get("/{key_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, key_id: FromPath[uuid.UUID]
    ) -> ApiKey:
        with transaction(runtime_of(request)) as conn:
            return api_keys.get_key(conn, project_id, key_id)

    @post(
        "/{key_id:uuid}/revoke",
        sync_to_thread=True,
        status_code=200,
        responses=conflict("The key is the project's last live admin key (`last_admin_key`)."),
    )
    def revoke(
        self, request: Request[Any, Any, Any], project_id: ProjectId, key_id: FromPath[uuid.UUID]
    ) -> ApiKey:
        """Revoke a key: from now on it authenticates as nothing, and the dashboard sessions signed in with
        it end at their next request. Revoking a revoked key changes nothing."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return api_keys.revoke_key(conn, project_id, key_id, now=runtime.clock.now())
