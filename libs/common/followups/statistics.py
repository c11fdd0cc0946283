"""Statistics of a sequence: its enrollments by outcome, and per step what was sent, skipped and replied."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import msgspec
from psycopg import Connection

from libs.common.core.sql import load_queries
from libs.common.followups.sequences import get_sequence

QUERIES = load_queries("libs.common.followups", "statistics.sql")


class StepStatistics(msgspec.Struct, kw_only=True):
    step_index: int
    sent: int = 0
    skipped: int = 0
    skipped_by_reason: dict[str, int] = msgspec.field(default_factory=dict)
    #: Enrollments whose contact replied after this step's message and before the next one.
    replies: int = 0


class SequenceStatistics(msgspec.Struct, kw_only=True):
    sequence_id: uuid.UUID
    enrolled: int = 0
    active: int = 0
    paused: int = 0
    completed: int = 0
    stopped: int = 0
    failed: int = 0
    stopped_by_reason: dict[str, int] = msgspec.field(default_factory=dict)
    #: One entry per step of the sequence's published versions (the longest one), in step order.
    steps: list[StepStatistics] = msgspec.field(default_factory=list)


def sequence_statistics(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID
) -> SequenceStatistics:
    get_sequence(conn, project_id, sequence_id)  # 404 for another project's sequence
    params = {"project_id": project_id, "sequence_id": sequence_id}
    stats = SequenceStatistics(sequence_id=sequence_id)
    for status, reason, count in conn.execute(QUERIES["enrollments_by_status"], params):
        stats.enrolled += count
        setattr(stats, status, getattr(stats, status) + count)
        if status == "stopped":
            key = reason or "unknown"
            stats.stopped_by_reason[key] = stats.stopped_by_reason.get(key, 0) + count
    # every step of the published versions, those nothing has reached yet included (with zeros)
    row = conn.execute(QUERIES["step_count"], params).fetchone()
    steps = {index: StepStatistics(step_index=index) for index in range(row[0] if row else 0)}
    for step_index, outcome, reason, count in conn.execute(QUERIES["step_runs_by_outcome"], params):
        step = steps.setdefault(step_index, StepStatistics(step_index=step_index))
        if outcome == "queued":
            step.sent += count
        else:
            step.skipped += count
            step.skipped_by_reason[reason or "unknown"] = (
                step.skipped_by_reason.get(reason or "unknown", 0) + count
            )
    for step_index, count in conn.execute(QUERIES["replies_after_step"], params):
        steps.setdefault(step_index, StepStatistics(step_index=step_index)).replies = count
    stats.steps = [steps[i] for i in sorted(steps)]
    return stats


class SequenceCounts(msgspec.Struct, kw_only=True):
    """A sequence's enrollments by status (the live ones are ``active`` and ``paused``)."""

    enrolled: int = 0
    active: int = 0
    paused: int = 0
    completed: int = 0
    stopped: int = 0
    failed: int = 0


def sequence_counts(
    conn: Connection[Any], project_id: uuid.UUID, sequence_ids: list[uuid.UUID]
) -> dict[uuid.UUID, SequenceCounts]:
    """The enrollments of each of the project's ``sequence_ids`` by status (zeros for one with none)."""
    counts = {sequence_id: SequenceCounts() for sequence_id in sequence_ids}
    params = {"project_id": project_id, "sequence_ids": sequence_ids}
    for sequence_id, status, count in conn.execute(QUERIES["enrollments_by_sequence"], params):
        found = counts.get(sequence_id)
        if found is not None:
            found.enrolled += count
            setattr(found, status, getattr(found, status) + count)
    return counts


class DailyActivity(msgspec.Struct, kw_only=True):
    """One UTC day of a sequence: enrollments made, step runs queued and skipped, enrollments finished."""

    day: date
    enrolled: int = 0
    queued: int = 0
    skipped: int = 0
    completed: int = 0
    stopped: int = 0


def daily_activity(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID, *, days: int, now: datetime
) -> list[DailyActivity]:
    """The last ``days`` UTC days of a sequence, oldest first, every day present (zeros when quiet)."""
    get_sequence(conn, project_id, sequence_id)  # 404 for another project's sequence
    today = now.date() if now.utcoffset() is None else now.astimezone(UTC).date()
    first = today - timedelta(days=days - 1)
    since = datetime.combine(first, datetime.min.time(), tzinfo=UTC)
    by_day = {first + timedelta(days=i): DailyActivity(day=first + timedelta(days=i)) for i in range(days)}
    params = {"project_id": project_id, "sequence_id": sequence_id, "since": since}
    for kind, day, count in conn.execute(QUERIES["daily_activity"], params):
        entry = by_day.get(day)
        if entry is not None and kind in DailyActivity.__struct_fields__:
            setattr(entry, kind, getattr(entry, kind) + count)
    return [by_day[day] for day in sorted(by_day)]
