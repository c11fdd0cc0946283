"""Sending numbers: register, read, list, rename, make the default, connect or disconnect."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody

from libs.common.platform import numbers
from libs.common.platform.numbers import Number, NumberCreate, NumberUpdate
from services.api.deps import PageLimit, ProjectId, page, runtime_of, transaction
from services.api.openapi import conflict
from services.api.routes import Page, as_page


class NumbersController(Controller):
    path = "/v1/numbers"
    tags = ["numbers"]

    @post("/", sync_to_thread=True, responses=conflict("A number with this phone is registered already."))
    def create(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[NumberCreate]
    ) -> Number:
        """Register a sending number (409 if the phone number is registered already)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return numbers.create_number(conn, project_id, data, now=runtime.clock.now())

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
    ) -> Page[Number]:
        """A page of numbers; pass the returned ``next`` as ``after`` for the next page."""
        with transaction(runtime_of(request)) as conn:
            return as_page(page(numbers.list_numbers(conn, project_id, limit=limit + 1, after=after), limit))

    @get("/{number_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, number_id: FromPath[uuid.UUID]
    ) -> Number:
        with transaction(runtime_of(request)) as conn:
            return numbers.get_number(conn, project_id, number_id)

    @patch("/{number_id:uuid}", sync_to_thread=True)
    def update(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        number_id: FromPath[uuid.UUID],
        data: JSONBody[NumberUpdate],
    ) -> Number:
        """Rename it, make it the project's default, or set its status. Connecting a number this way does
        not resume paused enrollments; the platform's ``number.connected`` event does."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return numbers.update_number(conn, project_id, number_id, data, now=runtime.clock.now())
