"""Business portfolios: create, read, list, rename or set the tier (the messaging limit its numbers share);
a number joins one through ``/v1/numbers`` (``portfolio_id``)."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody

from libs.common.platform import portfolios
from libs.common.platform.portfolios import Portfolio, PortfolioCreate, PortfolioUpdate
from services.api.deps import PageLimit, ProjectId, page, runtime_of, transaction
from services.api.routes import Page, as_page


class PortfoliosController(Controller):
    path = "/v1/portfolios"
    tags = ["portfolios"]

    @post("/", sync_to_thread=True)
    def create(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[PortfolioCreate]
    ) -> Portfolio:
        """A new portfolio, with its tier (default ``tier_250``)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return portfolios.create_portfolio(conn, project_id, data, now=runtime.clock.now())

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
    ) -> Page[Portfolio]:
        """A page of portfolios; pass the returned ``next`` as ``after`` for the next page."""
        with transaction(runtime_of(request)) as conn:
            listed = portfolios.list_portfolios(conn, project_id, limit=limit + 1, after=after)
            return as_page(page(listed, limit))

    @get("/{portfolio_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, portfolio_id: FromPath[uuid.UUID]
    ) -> Portfolio:
        with transaction(runtime_of(request)) as conn:
            return portfolios.get_portfolio(conn, project_id, portfolio_id)

    @patch("/{portfolio_id:uuid}", sync_to_thread=True)
    def update(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        portfolio_id: FromPath[uuid.UUID],
        data: JSONBody[PortfolioUpdate],
    ) -> Portfolio:
        """Rename it, or set its tier (a platform event may set it too)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return portfolios.update_portfolio(conn, project_id, portfolio_id, data, now=runtime.clock.now())
