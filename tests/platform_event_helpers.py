"""What the platform event tests share: posting an event to ``POST /v1/events``, a sequence with its
stop flags, reading an enrollment's status, its queued message, the outbox and the failed events, and the
stop counters."""

from __future__ import annotations

import uuid
from typing import Any

from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep, StopFlags
from services.release.release import release_batch
from tests.factories import make_sequence
from tests.helpers import rows

DAY = 86400


def one(pool: ConnectionPool, sql: str, *params: Any) -> Any:
    found = rows(pool, sql, *params)
    assert len(found) == 1, found
    return found[0][0] if len(found[0]) == 1 else found[0]


def stopped_total(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "whatstig_followup_finished_total", {"status": "stopped", "reason": reason}
    )
    return value or 0.0


def release(runtime: Runtime) -> int:
    return release_batch(runtime.pool, runtime.clock, runtime.settings.followup)


def post_event(client: TestClient[Any], event: dict[str, Any], expected: int | None = None) -> dict[str, Any]:
    response = client.post("/v1/events", json=event)
    if expected is not None:
        assert response.status_code == expected, response.text
    body: dict[str, Any] = response.json()
    return body


def sequence_with(
    pool: ConnectionPool, project_id: uuid.UUID, *, steps: int = 2, **stop_on: bool
) -> uuid.UUID:
    """A sequence whose first message goes at once and (with ``steps=2``) a second a day later."""
    all_steps = [MessageStep(text="first"), MessageStep(text="second", delay_seconds=DAY)][:steps]
    return make_sequence(pool, project_id, *all_steps, stop_on=StopFlags(**stop_on))


def status_of(pool: ConnectionPool, enrollment_id: uuid.UUID) -> tuple[str, str | None]:
    found: tuple[str, str | None] = one(
        pool, "SELECT status, reason FROM followup_enrollments WHERE id = %s", enrollment_id
    )
    return found


def message_of(pool: ConnectionPool, enrollment_id: uuid.UUID) -> tuple[uuid.UUID, str]:
    found: tuple[uuid.UUID, str] = one(
        pool,
        "SELECT id, status FROM messages WHERE followup_enrollment_id = %s ORDER BY created_at DESC LIMIT 1",
        enrollment_id,
    )
    return found


def outbox(pool: ConnectionPool, type_: str) -> list[dict[str, Any]]:
    return [r[0] for r in rows(pool, "SELECT data FROM outbox WHERE type = %s ORDER BY id", type_)]
