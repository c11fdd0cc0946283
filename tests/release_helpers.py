"""What the release scenarios share: a published sequence of steps, releasing on the controllable clock
(one step, or all that are due), and what a release left behind (messages, step runs, the enrollment's
state, events, row counts, metric samples)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.settings import FollowupSettings
from libs.common.followups.definition import Definition, Step
from libs.common.followups.release_step import Released
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from services.release.release import release_batch, release_one
from tests.helpers import rows

SETTINGS = FollowupSettings()
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def sequence(pool: ConnectionPool, project_id: uuid.UUID, *steps: Step, **options: Any) -> uuid.UUID:
    """A published sequence of ``steps`` (message or AI steps)."""
    with pool.connection() as conn:
        created = create_sequence(
            conn,
            project_id,
            SequenceCreate(
                name=f"seq {uuid.uuid4().hex[:6]}", definition=Definition(steps=list(steps), **options)
            ),
        )
        publish_sequence(conn, project_id, created.id)
    return created.id


def release(pool: ConnectionPool, clock: ManualClock) -> Released:
    """Release one step, which must be due."""
    result = release_one(pool, clock, SETTINGS)
    assert result is not None, "nothing was due"
    return result


def release_all(pool: ConnectionPool, clock: ManualClock) -> int:
    return release_batch(pool, clock, SETTINGS)


def messages(pool: ConnectionPool, enrollment_id: uuid.UUID) -> list[tuple[Any, ...]]:
    """(body, status, step index, source, direction) of an enrollment's messages, in step order."""
    return rows(
        pool,
        "SELECT body, status, followup_step_index, source, direction FROM messages"
        " WHERE followup_enrollment_id = %s ORDER BY followup_step_index",
        enrollment_id,
    )


def bodies(pool: ConnectionPool, enrollment_id: uuid.UUID) -> list[str]:
    return [m[0] for m in messages(pool, enrollment_id)]


def step_runs(pool: ConnectionPool, enrollment_id: uuid.UUID) -> list[tuple[Any, ...]]:
    """(step index, outcome, reason) of an enrollment's step runs."""
    return rows(
        pool,
        "SELECT step_index, outcome, reason FROM followup_step_runs WHERE enrollment_id = %s"
        " ORDER BY step_index",
        enrollment_id,
    )


def state(pool: ConnectionPool, enrollment_id: uuid.UUID) -> tuple[Any, ...]:
    """(status, reason, step index, next_run_at) of an enrollment."""
    return rows(
        pool,
        "SELECT status, reason, step_index, next_run_at FROM followup_enrollments WHERE id = %s",
        enrollment_id,
    )[0]


def events(pool: ConnectionPool, enrollment_id: uuid.UUID | None = None) -> list[str]:
    """Outbox event types in order (of one enrollment and its messages, when given); the contact's replies'
    own ``message.received`` left out."""
    if enrollment_id is None:
        return [
            r[0] for r in rows(pool, "SELECT type FROM outbox WHERE type <> 'message.received' ORDER BY id")
        ]
    return [
        r[0]
        for r in rows(
            pool,
            "SELECT type FROM outbox WHERE aggregate_id = %s OR data->>'followup_enrollment_id' = %s::text"
            " ORDER BY id",
            enrollment_id,
            enrollment_id,
        )
    ]


def count(pool: ConnectionPool, table: str) -> int:
    value: int = rows(pool, f"SELECT count(*) FROM {table}")[0][0]
    return value


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Metrics:
    """Deltas of Prometheus samples since construction."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self._start = {
            (name, tuple(sorted(labels.items()))): sample(name, **labels) for name, labels in samples
        }

    def delta(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return sample(name, **labels) - self._start[key]


STEPS = "whatstig_followup_steps_total"
FINISHED = "whatstig_followup_finished_total"
