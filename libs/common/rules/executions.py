"""Delayed rules (seed 002): a rule with ``execution_delay_minutes`` whose conditions hold when its event
happens records a pending execution instead of acting; when it falls due, the sweep re-checks it and runs
its actions, or skips it with the reason.

**Episodes** (:mod:`libs.common.rules.episodes`): one pending execution per (rule, conversation,
episode), its key from the anchors captured in the event's transaction.

**The sweep** (:func:`sweep`, every second and on nudge) claims due rows in a batch and leases them; each
then runs in a transaction of its own through the guard chain, each failure skipping it with its reason:
the rule deleted or inactive (``rule_inactive``); the conversation gone (``conversation_gone``); the episode
no longer current, recomputed from the conversation now (``episode_moved``); the rule's current conditions
false (``conditions_changed``); found more than the staleness limit late (``expired``: counted from the
due time, or from when the execution was recorded when it was due already then, as a status rule on a
conversation long in its status is). An erased contact's pending executions are skipped
``contact_erased`` by the erasure itself (:mod:`libs.common.rules.erasure`). Else the actions
run through the same code as the immediate path, and the row becomes ``executed`` in the same transaction
(a message is queued exactly once). A business refusal of an action skips the row with its code
(``opted_out``, ...). An unexpected error retries the row after a backoff, then skips it ``failed``.

Statuses: ``pending`` (waiting; ``locked_until`` set while a sweeper holds its lease), ``executed``,
``skipped``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, get_args

import msgspec
from psycopg import Connection
from psycopg.rows import dict_row, kwargs_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.effects import savepoint
from libs.common.core.errors import Conflict, NotFound
from libs.common.core.jobs import (
    STANDARD_BACKOFF,
    Failure,
    Fairness,
    OwnTransactions,
    Retry,
    RoundRobin,
    claim_in_turns,
    run_batch,
)
from libs.common.core.metrics import RULE_EXECUTION_LAG, RULE_EXECUTIONS, RULE_PENDING_EXECUTIONS
from libs.common.core.reasons import Other, split, stored
from libs.common.core.runtime import Runtime
from libs.common.core.sql import load_queries
from libs.common.followups.project_settings import get_settings
from libs.common.followups.send_window import add_open_time, zone
from libs.common.followups.stops import count_stopped
from libs.common.rules.actions import BUSINESS_ERRORS, Done, RuleRefusal, Subject, refusal_of, run_actions
from libs.common.rules.episodes import Episode, current_key, episode_of, involves_status
from libs.common.rules.rules import RULES, ActiveRule
from libs.common.rules.trace import DelayedRun, Recorded, record

log = logging.getLogger(__name__)

#: Where this process's sweeps resume: in turns across the projects with pending executions.
TURNS = RoundRobin()

QUERIES = load_queries("libs.common.rules", "executions.sql")

#: How long a claimed execution is kept from other sweepers while it runs.
LEASE = timedelta(minutes=2)
#: An execution whose actions keep failing: retried after 30 s, doubling, at most an hour; skipped ``failed``.
RETRY = Retry(max_attempts=5, backoff=STANDARD_BACKOFF)
#: How often a process recounts the pending gauge.
GAUGE_EVERY_SECONDS = 15.0

#: Why the guard chain skips an execution that fell due (in its order; :func:`_guard`).
GuardReason = Literal["rule_inactive", "conversation_gone", "episode_moved", "conditions_changed", "expired"]
#: Why an execution was skipped (``rule_pending_executions.skip_reason``, with the detail of
#: ``missing_variable``): the guard chain, cancelled by hand (``cancelled``, executions.sql), its contact
#: erased (``contact_erased``, erasure.sql), its actions failing on every attempt (``failed``,
#: executions.sql), or an action's refusal (the codes of the immediate path).
SkipReason = Literal[GuardReason, "cancelled", "contact_erased", "failed", RuleRefusal]


# --- at event time ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToSchedule:
    """A delayed rule that matched a trigger."""

    rule: ActiveRule
    subject: Subject


def schedule(
    conn: Connection[Any], project_id: uuid.UUID, matched: list[ToSchedule], *, now: datetime
) -> list[tuple[ToSchedule, DelayedRun]]:
    """Record the pending executions of the project's delayed rules that matched (its triggers), in the
    caller's transaction; returns those recorded, each with its episode and due time. An event whose
    episode has already ended (a backlog: the conversation moved on before its trigger was processed)
    records nothing; several events of one episode in the batch record one execution (a reply chase due
    after the latest reply)."""
    assert all(item.subject.project_id == project_id for item in matched)
    anchors = _current_anchors(
        conn, project_id, [item.subject.conversation_id for item in matched if item.subject.conversation_id]
    )
    by_key: dict[tuple[uuid.UUID, uuid.UUID | None, str], dict[str, Any]] = {}
    dues: dict[tuple[uuid.UUID, uuid.UUID | None, str], datetime] = {}
    recorded: list[tuple[ToSchedule, DelayedRun]] = []
    business = BusinessHours()
    for item in matched:
        episode = rule_episode(item.rule, item.subject)
        if item.subject.conversation_id is not None:
            current = anchors.get(item.subject.conversation_id)
            if current is None or current_key(episode.kind, current) != episode.key:
                continue
        due = due_time(conn, item.rule, item.subject.project_id, episode, business)
        recorded.append((item, DelayedRun(episode_kind=episode.kind, episode_key=episode.key, due_at=due)))
        key = (item.rule.id, item.subject.conversation_id, episode.key)
        if key in dues and dues[key] >= due:
            continue
        dues[key] = due
        by_key[key] = {
            "rule_id": str(item.rule.id),
            "conversation_id": str(item.subject.conversation_id) if item.subject.conversation_id else None,
            "contact_id": str(item.subject.contact_id),
            "trigger_id": item.subject.trigger_id,
            "episode_key": episode.key,
            "episode_kind": episode.kind,
            "due_at": due.astimezone(UTC).isoformat(),
        }
    if by_key:
        params = {"project_id": project_id, "rows": Jsonb(list(by_key.values())), "now": now}
        conn.execute(QUERIES["schedule"], params)
    return recorded


def rule_episode(rule: ActiveRule, subject: Subject) -> Episode:
    """The episode a delayed rule's execution for the trigger ``subject`` belongs to (a status episode's
    clock starts when the status was entered if the rule's conditions involve the status)."""
    return episode_of(subject, from_status=involves_status(rule.conditions))


class BusinessHours:
    """Each project's business hours and time zone, read once per :func:`schedule` (or dry run)."""

    def __init__(self) -> None:
        self._known: dict[uuid.UUID, tuple[Any, Any]] = {}

    def of(self, conn: Connection[Any], project_id: uuid.UUID) -> tuple[Any, Any]:
        if project_id not in self._known:
            self._known[project_id] = _business_hours(conn, project_id)
        return self._known[project_id]


def due_time(
    conn: Connection[Any],
    rule: ActiveRule,
    project_id: uuid.UUID,
    episode: Episode,
    business: BusinessHours | None = None,
) -> datetime:
    """When a delayed rule's execution of ``episode`` falls due: the episode's start plus the rule's delay,
    counted in the project's business hours when the rule says so (and the project has some)."""
    delay = timedelta(minutes=rule.execution_delay_minutes or 0)
    if rule.delay_in_business_hours:
        hours, tz = (business or BusinessHours()).of(conn, project_id)
        if hours is not None:
            return add_open_time(hours, episode.since, delay, tz)
    return episode.since + delay


def _current_anchors(
    conn: Connection[Any], project_id: uuid.UUID, conversations: list[uuid.UUID]
) -> dict[uuid.UUID, dict[str, Any]]:
    """The anchors now of some of the project's conversations, in the caller's transaction."""
    if not conversations:
        return {}
    with conn.cursor(row_factory=dict_row) as cur:
        params = {"project_id": project_id, "ids": list(set(conversations))}
        rows = cur.execute(QUERIES["anchors"], params).fetchall()
    return {row["id"]: row for row in rows}


def _business_hours(conn: Connection[Any], project_id: uuid.UUID) -> tuple[Any, Any]:
    """The project's business hours and its time zone."""
    found = conn.execute(QUERIES["project_timezone"], {"project_id": project_id}).fetchone()
    return get_settings(conn, project_id).business_hours, zone(None, found[0] if found else None)


# --- the sweep -------------------------------------------------------------------------------------------


@dataclass
class Swept:
    """What one sweep did."""

    claimed: int = 0
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    done: Done = field(default_factory=Done)


_last_gauge = [0.0]


def sweep(
    pool: ConnectionPool,
    clock: Clock,
    *,
    stale_after: timedelta,
    limit: int = 100,
    runtime: Runtime | None = None,
) -> Swept:
    """Run the delayed rules that fell due: claim a batch (and re-check the rules' current conditions for
    all of it in one query per rule), then each in a transaction of its own (the job runner's, whose
    after-commit effects run with ``runtime`` once it committed; without one, they are dropped)."""
    swept = Swept()
    ran = run_batch(_Sweep(pool, clock, stale_after, swept, runtime=runtime), limit=limit, fairness=TURNS)
    swept.claimed = ran.claimed
    for (outcome, reason), count in swept.outcomes.items():
        RULE_EXECUTIONS.labels(outcome, reason).inc(count)
    for stopped in swept.done.stopped:
        count_stopped(stopped)
    if time.monotonic() - _last_gauge[0] >= GAUGE_EVERY_SECONDS or (ran.claimed and ran.claimed < limit):
        _last_gauge[0] = time.monotonic()
        with pool.connection() as conn:
            RULE_PENDING_EXECUTIONS.set(conn.execute(QUERIES["count_pending"]).fetchone()[0])  # type: ignore[index]
    return swept


@dataclass
class _Sweep(OwnTransactions[dict[str, Any]]):
    """The delayed executions queue: a leased batch, each execution in a transaction of its own."""

    retry = RETRY
    refusals = BUSINESS_ERRORS
    pool: ConnectionPool
    clock: Clock
    stale_after: timedelta
    swept: Swept
    runtime: Runtime | None = None
    until: datetime = datetime.min
    #: Each claimed execution's rule re-checked now (its trace: the root's result is whether it holds; None:
    #: not re-checked, the rule inactive or the trigger gone), or the error its re-check met.
    holds: dict[uuid.UUID, Recorded | Exception | None] = field(default_factory=dict)

    def claim(self, limit: int, fairness: Fairness) -> list[dict[str, Any]]:
        now = self.clock.now()
        self.until = now + LEASE
        with self.pool.connection() as conn:
            params = {"now": now, "until": self.until} | fairness.params(limit)
            claimed = claim_in_turns(conn, QUERIES["due_shares"], QUERIES["claim_due"], params, dict_row)
            fairness.served(list(dict.fromkeys(item["project_id"] for item in claimed)))
            self.holds = _conditions(conn, claimed)
        return claimed

    def run(self, ctx: Connection[Any], item: dict[str, Any]) -> None:
        holds = self.holds.get(item["id"])
        if isinstance(holds, Exception):
            raise holds  # its rule's re-check failed: this execution backs off, alone
        _execute(ctx, item, self.until, holds, self.stale_after, self.swept, self.clock.now())
        return None

    def refused(self, ctx: Connection[Any], item: dict[str, Any], refusal: Exception) -> None:
        row = _relock(ctx, item, self.until)
        if row is not None:
            reason, detail = refusal_of(refusal)
            held = self.holds.get(item["id"])
            trace = held if isinstance(held, Recorded) else None
            _finish(
                ctx, row, "skipped", reason, None, self.swept, self.clock.now(), detail=detail, trace=trace
            )
            context = _context(row) | {"lease_until": self.until.isoformat()}
            log.info("delayed rule refused", extra=context | {"reason": reason})

    def attempt(self, item: dict[str, Any]) -> int:
        return int(item["attempts"]) + 1

    def record(self, ctx: Connection[Any], item: dict[str, Any], failure: Failure) -> bool:
        return _failed(ctx, item, self.until, failure, self.swept, self.clock.now())

    def describe(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"execution_id": str(item["id"])} | {k: str(item[k]) for k in ("rule_id", "project_id")}


def _conditions(
    conn: Connection[Any], claimed: list[dict[str, Any]]
) -> dict[uuid.UUID, Recorded | Exception | None]:
    """Each claimed execution's rule, as it is now, re-checked over its trigger's context now: its trace
    (:mod:`~libs.common.rules.trace`: the root's result is whether it holds), one statement per rule, in a
    SAVEPOINT of its own; when it fails, each of its executions gets the error (and backs off alone when it
    runs), the other rules' are checked on."""
    by_rule: dict[tuple[uuid.UUID, uuid.UUID], list[dict[str, Any]]] = {}
    for item in claimed:
        by_rule.setdefault((item["project_id"], item["rule_id"]), []).append(item)
    holds: dict[uuid.UUID, Recorded | Exception | None] = {}
    for (project_id, rule_id), items in by_rule.items():
        try:
            with savepoint(conn):
                rule = RULES.rule(conn, project_id, rule_id)
                if rule is None:
                    continue  # inactive or deleted: the guard chain says so
                triggers = [item["trigger_id"] for item in items if item["trigger_id"] is not None]
                by_trigger = record(conn, project_id, rule.conditions, triggers)
        except Exception as exc:
            for item in items:
                holds[item["id"]] = exc
            continue
        for item in items:
            holds[item["id"]] = by_trigger.get(item["trigger_id"])
    return holds


def _execute(
    conn: Connection[Any],
    execution: Leased,
    until: datetime,
    trace: Recorded | None,
    stale_after: timedelta,
    swept: Swept,
    now: datetime,
) -> None:
    """One execution under this sweeper's lease (as claimed: its ``project_id`` and ``id``): the guard chain,
    then the actions and the status in one transaction. A refusal or an error raises: the job runner rolls
    it back and records the outcome."""
    row = _relock(conn, execution, until)
    if row is None:
        return  # done meanwhile, or taken over by another sweeper after the lease ran out
    context = _context(row) | {"lease_until": until.isoformat()}
    rule = RULES.rule(conn, row["project_id"], row["rule_id"])
    reason = _guard(row, rule, trace is not None and trace.holds, stale_after, now)
    if reason is not None:
        _finish(conn, row, "skipped", reason, None, swept, now, trace=trace)
        log.info("delayed rule skipped", extra=context | {"reason": reason})
        return
    assert rule is not None
    subject = Subject(
        trigger_id=row["trigger_id"],
        trigger_public_id=row["trigger_public_id"],
        type=row["trigger_type"],
        project_id=row["project_id"],
        contact_id=row["contact_id"],
        conversation_id=row["conversation_id"],
        payload=row["payload"],
        occurred_at=row["occurred_at"],
        execution_id=row["id"],
    )
    done = run_actions(conn, rule.id, rule.actions, subject, now=now)
    message_id = done.message_ids[0] if done.message_ids else None
    _finish(conn, row, "executed", None, message_id, swept, now, trace=trace)
    swept.done.webhook_delivery_ids += done.webhook_delivery_ids
    swept.done.message_ids += done.message_ids
    swept.done.stopped += done.stopped
    log.info("delayed rule executed", extra=context)


def _context(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "execution_id": str(row["id"]),
        "rule_id": str(row["rule_id"]),
        "project_id": str(row["project_id"]),
        "conversation_id": str(row["conversation_id"]) if row["conversation_id"] else None,
    }


#: An execution as claimed (the claim's row): what names it is its ``project_id`` and ``id``.
Leased = Mapping[str, Any]


def _relock(conn: Connection[Any], execution: Leased, until: datetime) -> dict[str, Any] | None:
    params = {"project_id": execution["project_id"], "id": execution["id"], "until": until}
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(QUERIES["lock_leased"], params).fetchone()


def _failed(
    conn: Connection[Any],
    execution: Leased,
    until: datetime,
    failure: Failure,
    swept: Swept,
    now: datetime,
) -> bool:
    """A failed attempt: the execution is retried after the backoff, or skipped ``failed`` after its last
    attempt; False when it is no longer under this sweeper's lease."""
    row = _relock(conn, execution, until)
    if row is None:
        return False
    params = {
        "project_id": row["project_id"],
        "id": row["id"],
        "error": repr(failure.error)[:1000],
        "retry_at": failure.retry_at(now),
        "given_up": failure.given_up,
        "now": now,
    }
    status = conn.execute(QUERIES["failed"], params).fetchone()
    given_up = status is not None and status[0] == "skipped"
    swept.outcomes[("skipped", "failed") if given_up else ("retry", "error")] += 1
    log.log(
        logging.ERROR if given_up else logging.WARNING,
        "delayed rule failed; given up" if given_up else "delayed rule failed; retried later",
        extra=_context(row) | {"attempts": row["attempts"] + 1, "error": repr(failure.error)},
        exc_info=failure.error if isinstance(failure.error, BaseException) else None,
    )
    return True


def _guard(
    row: dict[str, Any], rule: ActiveRule | None, holds: bool, stale_after: timedelta, now: datetime
) -> GuardReason | None:
    """The guard chain, in order: the first reason to skip, or None to run the actions."""
    if not row["rule_active"] or rule is None:
        return "rule_inactive"
    if row["episode_kind"] != "event" and not row["conversation_exists"]:
        return "conversation_gone"
    if row["trigger_type"] is None:  # the trigger that opened the episode was pruned: it cannot be re-checked
        return "expired"
    current = current_key(row["episode_kind"], row)
    if current is not None and current != row["episode_key"]:
        return "episode_moved"
    if not holds:
        return "conditions_changed"
    if now - max(row["due_at"], row["created_at"]) > stale_after:  # late since it could first run
        return "expired"
    return None


def _finish(
    conn: Connection[Any],
    row: dict[str, Any],
    status: Literal["executed", "skipped"],
    reason: SkipReason | None,
    message_id: uuid.UUID | None,
    swept: Swept,
    now: datetime,
    *,
    detail: str | None = None,
    trace: Recorded | None = None,
) -> None:
    """An execution executed, or skipped for ``reason`` (stored with its ``detail``), with its conditions'
    trace as re-checked when it fell due."""
    skip_reason = stored(reason, detail) if reason is not None else None
    params = {
        "project_id": row["project_id"],
        "id": row["id"],
        "status": status,
        "skip_reason": skip_reason,
        "message_id": message_id,
        "trace": Jsonb(msgspec.to_builtins(trace)) if trace is not None else None,
        "now": now,
    }
    conn.execute(QUERIES["finish"], params)
    swept.outcomes[(status, reason or "none")] += 1
    RULE_EXECUTION_LAG.observe(max(0.0, (now - row["due_at"]).total_seconds()))


# --- reads ---------------------------------------------------------------------------------


ExecutionStatus = Literal["pending", "executed", "skipped"]
#: The skip reasons this version writes (a stored one it does not know reads as ``other``).
SKIP_REASONS: Final[frozenset[SkipReason]] = frozenset(get_args(SkipReason))


class Execution(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    rule_id: uuid.UUID
    conversation_id: uuid.UUID | None
    contact_id: uuid.UUID | None
    episode_key: str
    due_at: datetime
    status: ExecutionStatus
    #: Why a skipped execution was skipped (null otherwise); ``other`` for a code this version does not
    #: know (its stored text is the detail).
    skip_reason: Literal[SkipReason, Other] | None
    #: What the reason is about (the placeholder of ``missing_variable``), if anything.
    skip_detail: str | None
    executed_at: datetime | None
    message_id: uuid.UUID | None
    attempts: int
    created_at: datetime
    updated_at: datetime


def _execution(*, skip_reason: str | None, **columns: Any) -> Execution:
    """An execution from its row, its stored ``code:detail`` skip reason split in two."""
    reason, detail = split(skip_reason, SKIP_REASONS)
    return Execution(skip_reason=reason, skip_detail=detail, **columns)


#: Row factory of an execution's columns (list_executions, cancel).
EXECUTION_ROW = kwargs_row(_execution)


def list_executions(
    conn: Connection[Any],
    project_id: uuid.UUID,
    *,
    rule_id: uuid.UUID | None = None,
    conversation_id: uuid.UUID | None = None,
    status: str | None = None,
    limit: int,
    after: uuid.UUID | None = None,
) -> list[Execution]:
    """A page of executions, newest first (of one rule, or one conversation)."""
    params = {
        "project_id": project_id,
        "rule_id": rule_id,
        "conversation_id": conversation_id,
        "status": status,
        "limit": limit,
        "after": after,
    }
    with conn.cursor(row_factory=EXECUTION_ROW) as cur:
        return cur.execute(QUERIES["list_executions"], params).fetchall()


def cancel_execution(
    conn: Connection[Any],
    project_id: uuid.UUID,
    rule_id: uuid.UUID,
    execution_id: uuid.UUID,
    *,
    now: datetime,
) -> Execution:
    """Cancel a pending execution of a delayed rule: it is skipped with reason ``cancelled`` and its actions
    never run. 404 for another rule's or project's; 409 once it is no longer pending (it ran, or was
    skipped)."""
    params = {"project_id": project_id, "rule_id": rule_id, "id": execution_id, "now": now}
    with conn.cursor(row_factory=EXECUTION_ROW) as cur:
        cancelled = cur.execute(QUERIES["cancel"], params).fetchone()
    if cancelled is None:
        if conn.execute(QUERIES["execution_exists"], params).fetchone() is None:
            raise NotFound("execution not found", field="execution_id")
        raise Conflict("the execution is no longer pending")
    RULE_EXECUTIONS.labels("skipped", "cancelled").inc()
    log.info(
        "rule execution cancelled",
        extra={"project_id": str(project_id), "rule_id": str(rule_id), "execution_id": str(execution_id)},
    )
    return cancelled


def pending_for_contact(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, limit: int = 100
) -> list[dict[str, Any]]:
    """A contact's executions still to come (pending, or being run), soonest first, with ``rule_name``."""
    params = {"project_id": project_id, "contact_id": contact_id, "limit": limit}
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(QUERIES["pending_for_contact"], params).fetchall()
