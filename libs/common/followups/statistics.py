"""Statistics of a sequence: its enrollments by outcome, and per step its messages by latest status, its
skips, the replies to it and the enrollments stopped before it (the definitions: ``docs/api.md``)."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import msgspec
from psycopg import Connection

from libs.common.core.sql import load_queries
from libs.common.followups.project_settings import get_settings
from libs.common.followups.sequences import get_sequence

QUERIES = load_queries("libs.common.followups", "statistics.sql")


#: The field of :class:`MessageCounts` each message status counts in.
_STATUS_FIELDS = {
    "QUEUED": "queued",
    "PROCESSING": "processing",
    "SENT": "sent",
    "DELIVERED": "delivered",
    "READ": "read",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
}


class MessageCounts(msgspec.Struct, kw_only=True):
    """Follow-up messages by their latest status, as the send lane reported it: each message counts once,
    in one field (a delivered message is ``delivered``, not also ``sent``), so the fields add up to
    ``total``."""

    #: Every message the steps queued.
    total: int = 0
    #: Waiting for the send lane (QUEUED: a reply may still cancel it).
    queued: int = 0
    #: Claimed by the send lane, nothing reported yet (PROCESSING).
    processing: int = 0
    #: Reported SENT, not delivered yet.
    sent: int = 0
    #: Reported DELIVERED, not read yet.
    delivered: int = 0
    read: int = 0
    #: Reported FAILED by the send lane (after it was sent, too).
    failed: int = 0
    #: Cancelled before the send lane claimed it (a stop path: a reply, an opt-out, a stop by hand).
    cancelled: int = 0
    #: Deleted since (its contact was erased, or retention removed it): its last status is unknown.
    deleted: int = 0

    def add(self, status: str | None, count: int) -> None:
        self.total += count
        name = _STATUS_FIELDS.get(status or "", "deleted")
        setattr(self, name, getattr(self, name) + count)


class StepStatistics(msgspec.Struct, kw_only=True):
    step_index: int
    #: The messages this step queued, by latest status.
    messages: MessageCounts = msgspec.field(default_factory=MessageCounts)
    #: Runs of this step that queued nothing (its ``only_if``, a missing variable, ...), by reason.
    skipped: int = 0
    skipped_by_reason: dict[str, int] = msgspec.field(default_factory=dict)
    #: Messages of this step the contact was sent (SENT, DELIVERED or READ) and answered before the next
    #: message of the sequence was sent to them.
    replied: int = 0
    #: Enrollments stopped while waiting for this step (it never ran for them), by reason.
    stopped: int = 0
    stopped_by_reason: dict[str, int] = msgspec.field(default_factory=dict)


class MonthlySpend(msgspec.Struct, kw_only=True):
    """A UTC month of a sequence's template messages the provider took, by category, and what they cost at
    the project's prices (``message_prices``)."""

    month: str
    messages_by_category: dict[str, int] = msgspec.field(default_factory=dict)
    amount: float = 0.0
    currency: str = "USD"


class SequenceStatistics(msgspec.Struct, kw_only=True):
    """A sequence's enrollments by status, and its steps' messages, skips, replies and stops (the steps'
    sums at the top); the definitions are those of ``docs/api.md``, the dashboard's results page shows
    these numbers."""

    sequence_id: uuid.UUID
    #: Enrollments, by status.
    enrolled: int = 0
    active: int = 0
    paused: int = 0
    completed: int = 0
    stopped: int = 0
    failed: int = 0
    stopped_by_reason: dict[str, int] = msgspec.field(default_factory=dict)
    #: Every step's messages, by latest status.
    messages: MessageCounts = msgspec.field(default_factory=MessageCounts)
    skipped: int = 0
    skipped_by_reason: dict[str, int] = msgspec.field(default_factory=dict)
    replied: int = 0
    #: One entry per step of the sequence's published versions (the longest one), in step order.
    steps: list[StepStatistics] = msgspec.field(default_factory=list)
    #: Per UTC month, oldest first: its template messages by category and their cost (empty while the
    #: project has no ``message_prices``).
    spend: list[MonthlySpend] = msgspec.field(default_factory=list)


def _bump(counts: dict[str, int], key: str | None, count: int) -> None:
    counts[key or "unknown"] = counts.get(key or "unknown", 0) + count


def sequence_statistics(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID
) -> SequenceStatistics:
    get_sequence(conn, project_id, sequence_id)  # 404 for another project's sequence
    params = {"project_id": project_id, "sequence_id": sequence_id}
    stats = SequenceStatistics(sequence_id=sequence_id)
    # every step of the published versions, those nothing has reached yet included (with zeros)
    row = conn.execute(QUERIES["step_count"], params).fetchone()
    steps = {index: StepStatistics(step_index=index) for index in range(row[0] if row else 0)}

    def step(index: int) -> StepStatistics:
        return steps.setdefault(index, StepStatistics(step_index=index))

    for status, reason, step_index, count in conn.execute(QUERIES["enrollments_by_status"], params):
        stats.enrolled += count
        setattr(stats, status, getattr(stats, status) + count)
        if status == "stopped":
            _bump(stats.stopped_by_reason, reason, count)
            at = step(step_index)
            at.stopped += count
            _bump(at.stopped_by_reason, reason, count)
    for step_index, outcome, reason, message_status, count in conn.execute(QUERIES["step_outcomes"], params):
        at = step(step_index)
        if outcome == "queued":
            at.messages.add(message_status, count)
            stats.messages.add(message_status, count)
        else:
            at.skipped += count
            stats.skipped += count
            _bump(at.skipped_by_reason, reason, count)
            _bump(stats.skipped_by_reason, reason, count)
    for step_index, count in conn.execute(QUERIES["replies_after_step"], params):
        step(step_index).replied = count
        stats.replied += count
    stats.steps = [steps[i] for i in sorted(steps)]
    stats.spend = monthly_spend(conn, project_id, sequence_id)
    return stats


def monthly_spend(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID) -> list[MonthlySpend]:
    """What the sequence's template messages cost each month: their count by category times the project's
    price of the category (none while the project has no prices)."""
    prices = get_settings(conn, project_id).message_prices
    if prices is None:
        return []
    params = {"project_id": project_id, "sequence_id": sequence_id}
    months: dict[str, MonthlySpend] = {}
    for month, category, count in conn.execute(QUERIES["template_messages_by_month"], params):
        spend = months.setdefault(month, MonthlySpend(month=month, currency=prices.currency))
        spend.messages_by_category[category] = count
        spend.amount = round(spend.amount + count * getattr(prices, category, 0.0), 6)
    return list(months.values())


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
