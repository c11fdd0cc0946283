"""Liveness, readiness and metrics; and how many threads the request handlers run in."""

from __future__ import annotations

import asyncio
import hmac
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.exceptions import NotFoundException

from libs.common.core import metrics
from libs.common.core.db import ping
from libs.common.core.errors import DatabaseUnavailable, Unauthorized
from libs.common.core.runtime import Runtime
from services.api.deps import runtime_of
from services.api.problems import problem

#: Longest a readiness probe waits for PostgreSQL before it answers 503.
READY_TIMEOUT_SECONDS = 1.5


@get("/health", sync_to_thread=False, tags=["system"])
def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@get("/ready", tags=["system"])
async def ready(request: Request[Any, Any, Any]) -> Response[Any]:
    """Readiness: PostgreSQL answers (503 within 1.5 s when it does not).

    Asked on the event loop over a connection of its own: a probe never waits for a request thread or a
    pooled connection, so it answers as fast when every request is stuck waiting for the database."""
    runtime = runtime_of(request)
    if runtime.pool.closed:
        return problem(503, "database pool closed")
    try:
        await ping(runtime.settings.database.url, timeout=READY_TIMEOUT_SECONDS)
    except DatabaseUnavailable as exc:
        return problem(503, f"database unreachable: {type(exc.__cause__).__name__}")
    return Response({"status": "ready"})


@get("/metrics", sync_to_thread=False, tags=["system"], include_in_schema=False)
def prometheus_metrics(request: Request[Any, Any, Any]) -> Response[Any]:
    """Prometheus exposition: 404 when ``API_METRICS_PORT`` serves it instead; with ``METRICS_TOKEN``,
    only to ``Authorization: Bearer <token>`` (compared in constant time)."""
    api = runtime_of(request).settings.api
    if api.metrics_port:
        raise NotFoundException()
    if api.metrics_token is not None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip().encode("latin-1")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, api.metrics_token.encode()):
            raise Unauthorized("/metrics needs the METRICS_TOKEN as a bearer token")
    # the content type carries its own charset: as a header it is sent as it is (media_type would add one)
    return Response(metrics.render(), headers={"content-type": metrics.CONTENT_TYPE})


def size_request_threads(app: Litestar) -> None:
    """On startup: ``API_THREADS`` threads for the sync handlers and dependencies.

    Litestar runs them in the event loop's default executor, which Python sizes ``min(32, CPUs + 4)``: 6
    threads on 2 CPUs. Each request holds its thread while it waits for the database, and a request that
    finds no free thread queues for one without a deadline: with 6 threads and 50 clients, the 2 s
    checkout timeout of an outage became a wait of up to 20 s. docs/operations.md ("Database outages")
    has the measurement."""
    runtime: Runtime = app.state.runtime
    threads = ThreadPoolExecutor(max_workers=runtime.settings.api.threads, thread_name_prefix="api-handler")
    asyncio.get_running_loop().set_default_executor(threads)
