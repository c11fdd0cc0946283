"""Liveness, readiness and metrics."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from libs.common.core import metrics
from services.api.deps import runtime_of
from services.api.problems import problem


@get("/health", sync_to_thread=False, tags=["system"])
def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@get("/ready", sync_to_thread=True, tags=["system"])
def ready(request: Request[Any, Any, Any]) -> Response[Any]:
    """Readiness: PostgreSQL answers."""
    try:
        with runtime_of(request).pool.connection(timeout=2) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return problem(503, f"database unreachable: {type(exc).__name__}")
    return Response({"status": "ready"})


@get("/metrics", sync_to_thread=False, tags=["system"], include_in_schema=False)
def prometheus_metrics() -> Response[bytes]:
    """Prometheus exposition."""
    # the content type carries its own charset: as a header it is sent as it is (media_type would add one)
    return Response(metrics.render(), headers={"content-type": metrics.CONTENT_TYPE})
