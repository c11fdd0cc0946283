"""Statistics of a sequence: its enrollments by outcome, and per step its messages by latest status, its
skips, the replies to it and the enrollments stopped before it; per path of its branches, waits and splits
a funnel; per experiment and variant the conversion rate with its 95 % interval; its conversions by goal
and step (the definitions: ``docs/api.md``)."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, Literal

import msgspec
from psycopg import Connection

from libs.common.core.sql import load_queries
from libs.common.followups.definition import BranchStep, ControlStep, Definition, SplitStep, WaitForReplyStep
from libs.common.followups.graph import HOLDOUT
from libs.common.followups.project_settings import get_settings
from libs.common.followups.sequences import get_sequence, version_definition

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


#: A control step's kind, told by the reason of its branched step run.
ControlKind = Literal["branch", "wait_for_reply", "split"]


def control_kind(path: str) -> ControlKind:
    """The kind of control step a branched step run's reason (the path it took) belongs to."""
    if path in ("replied", "no_reply"):
        return "wait_for_reply"
    if path == HOLDOUT or path.startswith("variant:"):
        return "split"
    return "branch"  # path:<name>, otherwise


def control_kind_of(node: ControlStep) -> ControlKind:
    """A control step's kind."""
    if isinstance(node, BranchStep):
        return "branch"
    return "wait_for_reply" if isinstance(node, WaitForReplyStep) else "split"


class PathStatistics(msgspec.Struct, kw_only=True):
    """One path a control step sent enrollments down, as a funnel: the enrollments that took it, and of
    those the ones sent a follow-up after it, the ones that replied and the ones converted."""

    step_index: int
    kind: ControlKind
    #: The path: ``path:<name>`` or ``otherwise`` (a branch), ``replied`` or ``no_reply`` (a wait for a
    #: reply), ``variant:<name>`` or ``holdout`` (a split).
    path: str
    #: Enrollments whose step run at this step took this path.
    entered: int = 0
    #: Of those, the ones with a follow-up queued at a later step.
    sent: int = 0
    #: Of those, the ones stopped by a reply or that took a reply path.
    replied: int = 0
    #: Of those, the ones converted (a goal met while live, or late inside the conversion window).
    converted: int = 0


#: The normal quantile of a two-sided 95 % interval.
Z_95: Final = 1.959963984540054


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion (95 % by default); None without trials."""
    if trials <= 0:
        return None
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return round(max(0.0, centre - half), 6), round(min(1.0, centre + half), 6)


class VariantStatistics(msgspec.Struct, kw_only=True):
    """One arm of an experiment: the enrollments assigned it and, of those, the ones sent a follow-up after
    the split, that replied, that converted; the conversion rate and its 95 % Wilson score interval."""

    #: The variant's name, or ``holdout``.
    variant: str
    assigned: int = 0
    sent: int = 0
    replied: int = 0
    converted: int = 0
    #: ``converted / assigned`` (None while nobody was assigned).
    conversion_rate: float | None = None
    #: ``[low, high]``, the 95 % Wilson score interval of the rate (None while nobody was assigned).
    conversion_interval: tuple[float, float] | None = None

    def add(self, assigned: int, sent: int, replied: int, converted: int) -> None:
        self.assigned += assigned
        self.sent += sent
        self.replied += replied
        self.converted += converted
        self.conversion_rate = round(self.converted / self.assigned, 6) if self.assigned else None
        self.conversion_interval = wilson_interval(self.converted, self.assigned)


class ExperimentStatistics(msgspec.Struct, kw_only=True):
    """An experiment (a split step) and its variants: the current version's, in order, then the holdout,
    then any an older version assigned."""

    experiment: str
    #: The split's step in the current version (None: an older version's experiment).
    step_index: int | None = None
    #: The variant chosen as the winner (``POST /v1/sequences/{id}/experiments/{experiment}/winner``, or
    #: the current version's split), and when it was chosen through the API.
    winner: str | None = None
    winner_chosen_at: datetime | None = None
    variants: list[VariantStatistics] = msgspec.field(default_factory=list)

    def variant(self, name: str) -> VariantStatistics:
        for found in self.variants:
            if found.variant == name:
                return found
        self.variants.append(VariantStatistics(variant=name))
        return self.variants[-1]


class StepConversions(msgspec.Struct, kw_only=True):
    #: The step a conversion is attributed to (the last step whose message was sent; None: none was).
    step_index: int | None
    converted: int = 0


class Conversions(msgspec.Struct, kw_only=True):
    """The sequence's converted enrollments, a goal met while live (status ``converted``) or late (a finished
    enrollment inside the conversion window), each counted once."""

    converted: int = 0
    by_goal: dict[str, int] = msgspec.field(default_factory=dict)
    by_step: list[StepConversions] = msgspec.field(default_factory=list)


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
    #: Ended by a goal met (``converted``) or an exit criterion (``exited``) while live.
    converted: int = 0
    exited: int = 0
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
    #: Per control step and path taken, a funnel; in step order.
    paths: list[PathStatistics] = msgspec.field(default_factory=list)
    #: Per experiment, its variants' numbers.
    experiments: list[ExperimentStatistics] = msgspec.field(default_factory=list)
    conversions: Conversions = msgspec.field(default_factory=Conversions)


def _bump(counts: dict[str, int], key: str | None, count: int) -> None:
    counts[key or "unknown"] = counts.get(key or "unknown", 0) + count


def sequence_statistics(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID
) -> SequenceStatistics:
    sequence = get_sequence(conn, project_id, sequence_id)  # 404 for another project's sequence
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
        elif outcome == "skipped":  # a control step's run (branched) is one of its paths
            at.skipped += count
            stats.skipped += count
            _bump(at.skipped_by_reason, reason, count)
            _bump(stats.skipped_by_reason, reason, count)
    for step_index, count in conn.execute(QUERIES["replies_after_step"], params):
        step(step_index).replied = count
        stats.replied += count
    stats.steps = [steps[i] for i in sorted(steps)]
    stats.spend = monthly_spend(conn, project_id, sequence_id)
    stats.paths = [
        PathStatistics(
            step_index=step_index,
            kind=control_kind(path),
            path=path,
            entered=entered,
            sent=sent,
            replied=replied,
            converted=converted,
        )
        for step_index, path, entered, sent, replied, converted in conn.execute(QUERIES["paths"], params)
        if path is not None
    ]
    current = (
        version_definition(conn, project_id, sequence.current_version_id)
        if sequence.current_version_id is not None
        else None
    )
    stats.experiments = experiment_statistics(conn, params, current)
    stats.conversions = conversions(conn, params)
    return stats


def experiment_statistics(
    conn: Connection[Any], params: dict[str, Any], current: Definition | None
) -> list[ExperimentStatistics]:
    """Each experiment's variants: the current version's splits first, in step order, each variant listed
    (zeros included) and the holdout when it has a weight; then what older versions assigned."""
    experiments: dict[str, ExperimentStatistics] = {}
    for index, node in enumerate(current.steps if current else []):
        if isinstance(node, SplitStep):
            found = experiments[node.experiment] = ExperimentStatistics(
                experiment=node.experiment, step_index=index, winner=node.winner
            )
            for variant in node.variants:
                found.variant(variant.name)
            if node.holdout_weight:
                found.variant(HOLDOUT)
    for experiment, variant, *counts in conn.execute(QUERIES["experiments"], params):
        found = experiments.setdefault(experiment, ExperimentStatistics(experiment=experiment))
        found.variant(variant).add(*counts)
    for experiment, variant, _version_id, chosen_at in conn.execute(QUERIES["winners"], params):
        found = experiments.setdefault(experiment, ExperimentStatistics(experiment=experiment))
        found.winner, found.winner_chosen_at = variant, chosen_at
    return list(experiments.values())


def conversions(conn: Connection[Any], params: dict[str, Any]) -> Conversions:
    """The sequence's conversions by goal and by attributed step (each converted enrollment once)."""
    out = Conversions()
    by_step: dict[int | None, int] = {}
    for goal, step_index, count in conn.execute(QUERIES["conversions"], params):
        out.converted += count
        _bump(out.by_goal, goal, count)
        by_step[step_index] = by_step.get(step_index, 0) + count
    out.by_step = [
        StepConversions(step_index=index, converted=count)
        for index, count in sorted(by_step.items(), key=lambda item: (item[0] is None, item[0] or 0))
    ]
    return out


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
    converted: int = 0
    exited: int = 0


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
    converted: int = 0
    exited: int = 0


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
