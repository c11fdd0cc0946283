"""Triggers: an event that may fire rules, recorded in the event's own transaction, then matched and acted
on by the triggers service.

1. :func:`record_trigger` writes a small ``followup_triggers`` row only when the project has an active rule
   for the event (the per-process rule cache answers), with the conversation's anchors of that moment.
   Only changes made by people and platforms record triggers: actions of rules and follow-up steps never
   call it, so rules never fire rules (the loop guard).
2. :func:`process_triggers` claims a batch (``FOR UPDATE SKIP LOCKED``, shared round-robin among the
   projects with due triggers: :data:`~libs.common.core.jobs.ROUND_ROBIN`), evaluates every candidate
   rule's conditions for the whole batch in a SAVEPOINT per (project, event), as few statements as keep
   each under :data:`MAX_BOUND_PARAMETERS` (a project's failing match backs off its own triggers only),
   and runs each matching rule's
   actions in a SAVEPOINT of its own (each trigger in a transaction of its own). A business refusal is an
   outcome (``rejected``); an unexpected error rolls the rule back and retries the trigger with backoff,
   skipping the rules that already ran (``rule_runs``), and gives up after :data:`MAX_ATTEMPTS`
   (``failed``).

Each trigger is counted in ``whatstig_followup_triggers_total{type,outcome}`` once the batch committed, per
rule it met: ``executed``, ``rejected``, ``not_matched``, ``delayed``; per trigger: ``no_rule`` (no active
rule any more), ``retry``, ``failed``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg import Connection, sql
from psycopg.rows import class_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.effects import NudgeTriggers, after_commit, savepoint
from libs.common.core.jobs import (
    ROUND_ROBIN,
    STANDARD_BACKOFF,
    Failed,
    Failure,
    Fairness,
    OwnTransactions,
    Retry,
    run_batch,
)
from libs.common.core.metrics import FOLLOWUP_TRIGGERS
from libs.common.core.runtime import Runtime
from libs.common.core.sql import load_queries
from libs.common.followups.stops import count_stopped
from libs.common.rules.actions import BUSINESS_ERRORS, Done, Subject, run_actions
from libs.common.rules.conditions import CONTEXT
from libs.common.rules.executions import ToSchedule, schedule
from libs.common.rules.rules import CACHE_TTL_SECONDS, RULES, ActiveRule

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.rules", "triggers.sql")

#: How a trigger whose rule keeps failing is retried: 30 s, doubling, at most an hour; given up after the
#: fifth attempt.
RETRY = Retry(max_attempts=5, backoff=STANDARD_BACKOFF)
#: Attempts before a trigger whose rule keeps failing is given up.
MAX_ATTEMPTS = RETRY.max_attempts
#: The first backoff of a failed trigger.
BACKOFF_MIN = STANDARD_BACKOFF.first
#: How long a claimed trigger is kept from other workers while its rules run.
LEASE = timedelta(minutes=2)
#: How much one matching statement weighs at most: its rules' parameters times its triggers (a project whose
#: rules are heavy has its triggers matched a few at a time).
MATCH_SLICE = 100_000
#: Rules of one (project, event) binding more parameters than this together are heavy: their triggers are
#: matched in the slow lane, a slice a tick, by one worker at a time per project (an advisory lock), never
#: in the batch the other projects' triggers share.
HEAVY_PARAMETERS = 5_000
#: After a slice of a group's slow lane that took d seconds, this process leaves that lane alone for
#: LANE_REST x d (it serves the shared batch meanwhile): heavy rules take at most a quarter of a worker.
LANE_REST = 3.0
#: Until when (monotonic) this process leaves each heavy group's lane alone.
_lane_rests_until: dict[tuple[uuid.UUID, str], float] = {}
#: The (project, event) groups this process found heavy, with their weight and until when it trusts that
#: (the rule cache's time to live): the shared batch defers them without loading their rules.
_HEAVY: dict[tuple[uuid.UUID, str], tuple[int, float]] = {}
#: Most parameters one matching statement binds (PostgreSQL takes at most 65,535): a project's rules are
#: matched in chunks that stay under it.
MAX_BOUND_PARAMETERS = 30_000


def record_trigger(
    conn: Connection[Any],
    project_id: uuid.UUID,
    event: str,
    *,
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID | None = None,
    payload: dict[str, Any] | None = None,
    now: datetime,
) -> uuid.UUID | None:
    """Record a trigger for ``event`` in the caller's transaction when the project has an active rule for
    it; returns its public id, the one the project sees (None: no rule listens)."""
    if not RULES.rules(conn, project_id, event):
        return None
    params = {
        "project_id": project_id,
        "type": event,
        "contact_id": contact_id,
        "conversation_id": conversation_id,
        "payload": Jsonb(payload or {}),
        "now": now,
    }
    row = conn.execute(QUERIES["insert_trigger"], params).fetchone()
    assert row is not None
    public_id: uuid.UUID = row[0]
    after_commit(conn, NudgeTriggers(project_id))  # the triggers service acts on it once it committed
    return public_id


@dataclass(frozen=True)
class _Claimed:
    id: int
    public_id: uuid.UUID
    type: str
    project_id: uuid.UUID
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    payload: dict[str, Any]
    occurred_at: datetime
    attempts: int


@dataclass
class Processed:
    """What a batch did."""

    triggers: int = 0
    #: The triggers the batch handled (processed, retried or given up).
    trigger_ids: list[int] = field(default_factory=list)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Each handled trigger with the moment (epoch seconds) its batch had committed (the slow lane's later).
    committed: list[tuple[int, float]] = field(default_factory=list)
    done: Done = field(default_factory=Done)


def process_triggers(
    pool: ConnectionPool, clock: Clock, *, limit: int = 100, runtime: Runtime | None = None
) -> Processed:
    """Match and act on a batch of due triggers; returns what it did (counted once committed). The
    after-commit effects of a trigger's rules (the release nudge of an enrollment made) run with ``runtime``
    once that trigger's transaction committed (without one, they are dropped).

    One short transaction claims the batch, evaluates the conditions of every candidate rule for all of it,
    marks the triggers no rule matched as processed and leases the others (:data:`LEASE`); then each of
    those runs its rules in a transaction of its own (the job runner's), so the locks its actions take (a
    contact, a conversation) are held for that trigger only and two workers never deadlock on each other's
    batch.
    """
    processed = Processed()
    batch = _Batch(pool, clock.now(), processed, runtime)
    run_batch(batch, limit=limit, fairness=ROUND_ROBIN)
    ids = batch.ids
    processed.committed += [(i, time.time()) for i in ids]
    for (project_id, kind), weight in batch.heavy.items():  # the slow lane: one heavy group a tick
        if time.monotonic() < _lane_rests_until.get((project_id, kind), 0.0):
            continue
        lane = _Batch(pool, clock.now(), processed, runtime, lane=(project_id, kind))
        started = time.monotonic()
        run_batch(lane, limit=max(1, MATCH_SLICE // weight), fairness=ROUND_ROBIN)
        took = time.monotonic() - started
        _lane_rests_until[(project_id, kind)] = time.monotonic() + took * LANE_REST
        ids = ids + lane.ids
        processed.committed += [(i, time.time()) for i in lane.ids]
        if lane.ids:
            break
    if not ids:
        return processed
    processed.triggers = len(ids)
    processed.trigger_ids = ids
    for (kind, outcome), count in processed.outcomes.items():
        FOLLOWUP_TRIGGERS.labels(kind, outcome).inc(count)
    for stopped in processed.done.stopped:
        count_stopped(stopped)
    return processed


#: A leased trigger and the rules it runs.
_ToRun = tuple[_Claimed, list[ActiveRule]]


class _Batch(OwnTransactions[_ToRun]):
    """The triggers queue: a claimed batch, each leased trigger then run in a transaction of its own."""

    retry = RETRY

    def __init__(
        self,
        pool: ConnectionPool,
        now: datetime,
        processed: Processed,
        runtime: Runtime | None,
        lane: tuple[uuid.UUID, str] | None = None,
    ) -> None:
        self.pool = pool
        #: The (project, event) whose heavy rules this batch matches (the slow lane), else None.
        self.lane = lane
        #: The heavy groups the batch deferred to the slow lane, with their weight.
        self.heavy: dict[tuple[uuid.UUID, str], int] = {}
        self.runtime = runtime
        self.now = now
        self.processed = processed
        self.until = now + LEASE
        #: Every trigger the claim took (matched or not).
        self.ids: list[int] = []

    def claim(self, limit: int, fairness: Fairness) -> list[_ToRun]:
        return _claim(self, limit, fairness)

    def run(self, ctx: Connection[Any], item: _ToRun) -> Failed | None:
        trigger, rules = item
        return _run(ctx, trigger, rules, self.until, self.processed, self.now)

    def attempt(self, item: _ToRun) -> int:
        return item[0].attempts + 1

    def record(self, ctx: Connection[Any], item: _ToRun, failure: Failure) -> bool:
        return _failed(ctx, item[0], self.until, failure, self.processed, self.now)

    def describe(self, item: _ToRun) -> dict[str, Any]:
        trigger = item[0]
        return {"trigger_id": trigger.id, "project_id": str(trigger.project_id), "event_type": trigger.type}


def _claim(batch: _Batch, limit: int, fairness: Fairness) -> list[_ToRun]:
    """Claim a batch of due triggers in one transaction: the ones no rule matched (or whose delayed rules
    only schedule) are processed at once, the others leased until ``until``; returns those, with the rules
    each runs. ``batch.ids`` receives every trigger claimed. A batch of the slow lane claims the oldest due
    triggers of its (project, event) only, and nothing while another worker's lane holds that project."""
    pool, now, until, processed, ids = batch.pool, batch.now, batch.until, batch.processed, batch.ids
    with pool.connection() as conn:
        with conn.cursor(row_factory=class_row(_Claimed)) as cur:
            params = {"now": now, "limit": limit} | fairness.params()
            if batch.lane is None:
                claimed = cur.execute(QUERIES["claim_triggers"], params).fetchall()
            else:
                project_id, kind = batch.lane
                claimed = cur.execute(
                    QUERIES["claim_lane"], params | {"project_id": project_id, "type": kind}
                ).fetchall()
        if not claimed:
            return []
        ids += [t.id for t in claimed]
        already = {(t, r) for t, r in conn.execute(QUERIES["already_run"], {"ids": ids}).fetchall()}
        candidates: dict[tuple[uuid.UUID, str], list[ActiveRule]] = {}
        matched, failed, deferred = _match(conn, claimed, candidates, processed, now, batch)
        ids[:] = [i for i in ids if i not in deferred]
        to_run: list[_ToRun] = []
        delayed: list[ToSchedule] = []
        for trigger in claimed:
            if trigger.id in failed or trigger.id in deferred:
                continue
            rules = _to_run(
                trigger, candidates[(trigger.project_id, trigger.type)], matched, already, delayed, processed
            )
            if rules:
                to_run.append((trigger, rules))
        if delayed:
            recorded = schedule(conn, delayed, now=now)
            runs = [
                {
                    "trigger_id": item.subject.trigger_id,
                    "rule_id": str(item.rule.id),
                    "project_id": str(item.subject.project_id),
                    "outcome": "scheduled",
                    "detail": None,
                }
                for item in recorded
            ]
            conn.execute(QUERIES["insert_rule_runs"], {"runs": Jsonb(runs), "now": now})
        running = [trigger.id for trigger, _ in to_run]
        done = set(running) | failed
        conn.execute(QUERIES["mark_processed"], {"ids": [i for i in ids if i not in done], "now": now})
        if running:
            conn.execute(QUERIES["lease"], {"ids": running, "until": until})
    return to_run


def _match(
    conn: Connection[Any],
    claimed: list[_Claimed],
    candidates: dict[tuple[uuid.UUID, str], list[ActiveRule]],
    processed: Processed,
    now: datetime,
    batch: _Batch,
) -> tuple[dict[int, list[bool]], set[int], set[int]]:
    """Every candidate rule's conditions for the claimed triggers (``candidates`` receives each (project,
    event)'s rules), the smallest groups first: a group's triggers a slice at a time (as many as
    :data:`MATCH_SLICE` allows for its rules' parameters), each slice in a SAVEPOINT of its own and in
    chunks of rules under :data:`MAX_BOUND_PARAMETERS`. When a slice's match fails, each of its triggers is
    matched alone, and the one that fails again is backed off (or given up) alone. A group whose rules weigh
    more than :data:`HEAVY_PARAMETERS` is deferred whole to the slow lane (``batch.heavy``; back to the
    queue, due as it was) unless this is its lane: its statements never hold up the others' batch. A group
    known heavy (:data:`_HEAVY`, as long as the rule cache keeps rules) is deferred without loading its
    rules. Returns the results, the triggers that failed and those deferred."""
    matched: dict[int, list[bool]] = {}
    failed: set[int] = set()
    deferred: set[int] = set()
    groups: dict[tuple[uuid.UUID, str], list[_Claimed]] = {}
    for trigger in claimed:
        groups.setdefault((trigger.project_id, trigger.type), []).append(trigger)
    for (project_id, kind), group in sorted(groups.items(), key=lambda item: len(item[1])):
        known = _HEAVY.get((project_id, kind))
        if batch.lane is None and known is not None and time.monotonic() < known[1]:
            batch.heavy[(project_id, kind)] = known[0]
            deferred.update(trigger.id for trigger in group)
            continue
        try:
            with conn.transaction():
                rules = candidates[(project_id, kind)] = RULES.rules(conn, project_id, kind)
        except Exception as exc:  # the project's rules cannot be read: its triggers back off
            for trigger in group:
                _write_failure(conn, trigger, RETRY.failure(exc, trigger.attempts + 1), processed, now)
                failed.add(trigger.id)
            continue
        weight = sum(len(rule.params) + 1 for rule in rules)
        if weight > HEAVY_PARAMETERS:
            _HEAVY[(project_id, kind)] = (weight, time.monotonic() + CACHE_TTL_SECONDS)
        else:
            _HEAVY.pop((project_id, kind), None)
        if batch.lane is None and weight > HEAVY_PARAMETERS:
            batch.heavy[(project_id, kind)] = weight
            deferred.update(trigger.id for trigger in group)
            continue
        size = max(1, MATCH_SLICE // max(1, weight))
        for start in range(0, len(group), size):
            _match_slice(conn, group[start : start + size], rules, matched, failed, processed, now)
    return matched, failed, deferred


def _match_slice(
    conn: Connection[Any],
    triggers: list[_Claimed],
    rules: list[ActiveRule],
    matched: dict[int, list[bool]],
    failed: set[int],
    processed: Processed,
    now: datetime,
) -> None:
    """Match a slice of one group's triggers in a SAVEPOINT; when it fails, each trigger alone."""
    try:
        with conn.transaction():
            matched.update(_match_group(conn, [t.id for t in triggers], rules))
        return
    except Exception as exc:
        if len(triggers) == 1:
            _write_failure(conn, triggers[0], RETRY.failure(exc, triggers[0].attempts + 1), processed, now)
            failed.add(triggers[0].id)
            return
    for trigger in triggers:  # which of them fails alone
        _match_slice(conn, [trigger], rules, matched, failed, processed, now)


def _match_group(conn: Connection[Any], ids: list[int], rules: list[ActiveRule]) -> dict[int, list[bool]]:
    """The rules' results for the triggers ``ids`` (of one project and event), a statement per chunk."""
    results: dict[int, list[bool]] = {i: [] for i in ids}
    if not rules:
        return {}
    for chunk in _chunks(rules):
        query = sql.SQL("SELECT t.id, ARRAY[{}] FROM {} WHERE t.id = ANY(%s)").format(
            sql.SQL(", ").join(rule.predicate for rule in chunk), CONTEXT
        )
        params = [param for rule in chunk for param in rule.params] + [ids]
        found = dict(conn.execute(query, params).fetchall())
        for trigger_id in list(results):
            if trigger_id in found:
                results[trigger_id] += found[trigger_id]
            else:
                del results[trigger_id]  # the contact is gone: no rule matches
    return results


def _chunks(rules: list[ActiveRule]) -> list[list[ActiveRule]]:
    """The rules in order, in chunks whose parameters (and the triggers' array) stay under the bound."""
    chunks: list[list[ActiveRule]] = [[]]
    bound = 1
    for rule in rules:
        if chunks[-1] and bound + len(rule.params) > MAX_BOUND_PARAMETERS:
            chunks.append([])
            bound = 1
        chunks[-1].append(rule)
        bound += len(rule.params)
    return chunks


def _to_run(
    trigger: _Claimed,
    rules: list[ActiveRule],
    matched: dict[int, list[bool]],
    already: set[tuple[int, uuid.UUID]],
    delayed: list[ToSchedule],
    processed: Processed,
) -> list[ActiveRule]:
    """The rules whose actions the trigger runs now: those that match and have not run for it yet; the
    delayed ones that match go to ``delayed`` (a pending execution each)."""
    results = matched.get(trigger.id)
    if not rules or results is None:  # no active rule any more, or the contact is gone
        processed.outcomes[(trigger.type, "no_rule")] += 1
        return []
    chosen = []
    for rule, holds in zip(rules, results, strict=True):
        if (trigger.id, rule.id) in already:
            continue
        if not holds:
            processed.outcomes[(trigger.type, "not_matched")] += 1
        elif rule.execution_delay_minutes is not None:
            # a delayed rule waits for its time and re-checks its conditions then
            delayed.append(ToSchedule(rule=rule, subject=_subject(trigger)))
            processed.outcomes[(trigger.type, "delayed")] += 1
        else:
            chosen.append(rule)
    return chosen


def _subject(trigger: _Claimed) -> Subject:
    """What the trigger is about, as its rules' actions (and a delayed rule's re-check) see it."""
    return Subject(
        trigger_id=trigger.id,
        trigger_public_id=trigger.public_id,
        type=trigger.type,
        project_id=trigger.project_id,
        contact_id=trigger.contact_id,
        conversation_id=trigger.conversation_id,
        payload=trigger.payload,
        occurred_at=trigger.occurred_at,
    )


def _run(
    conn: Connection[Any],
    trigger: _Claimed,
    rules: list[ActiveRule],
    until: datetime,
    processed: Processed,
    now: datetime,
) -> Failed | None:
    """Run the rules' actions for one leased trigger, each rule in a savepoint, then mark it processed; a
    rule that fails unexpectedly ends the attempt (:class:`Failed`): the rules that ran are kept and not run
    again when it is retried."""
    lease = {"id": trigger.id, "until": until, "attempts": trigger.attempts}
    if conn.execute(QUERIES["lock_leased"], lease).fetchone() is None:
        return None  # processed meanwhile, or taken over by another worker after the lease ran out
    context = {"trigger_id": trigger.id, "project_id": str(trigger.project_id), "event_type": trigger.type}
    subject = _subject(trigger)
    runs: list[dict[str, Any]] = []
    failed: Failed | None = None
    for rule in rules:
        run = {"trigger_id": trigger.id, "rule_id": str(rule.id), "project_id": str(trigger.project_id)}
        try:
            with savepoint(conn):  # a rule rolled back drops its after-commit effects too
                done = run_actions(conn, rule.id, rule.actions, subject, now=now)
        except BUSINESS_ERRORS as refusal:
            runs.append(run | {"outcome": "rejected", "detail": refusal.code})
            processed.outcomes[(trigger.type, "rejected")] += 1
            log.info("rule rejected", extra=context | {"rule_id": str(rule.id), "reason": refusal.code})
            continue
        except Exception as exc:
            failed = Failed(exc, about=rule)
            break
        runs.append(run | {"outcome": "executed", "detail": None})
        processed.outcomes[(trigger.type, "executed")] += 1
        processed.done.webhook_delivery_ids += done.webhook_delivery_ids
        processed.done.message_ids += done.message_ids
        processed.done.stopped += done.stopped
        log.info("rule executed", extra=context | {"rule_id": str(rule.id)})
    if runs:
        conn.execute(QUERIES["insert_rule_runs"], {"runs": Jsonb(runs), "now": now})
    if failed is None:
        conn.execute(QUERIES["mark_processed"], {"ids": [trigger.id], "now": now})
    return failed


def _failed(
    conn: Connection[Any],
    trigger: _Claimed,
    until: datetime,
    failure: Failure,
    processed: Processed,
    now: datetime,
) -> bool:
    """A failed attempt at a leased trigger (of the rule ``failure.about``, or outside the rules): retried
    after the backoff, or given up ``failed``; False when the lease was lost meanwhile."""
    lease = {"id": trigger.id, "until": until, "attempts": trigger.attempts}
    if conn.execute(QUERIES["lock_leased"], lease).fetchone() is None:
        return False
    _write_failure(conn, trigger, failure, processed, now)
    return True


def _write_failure(
    conn: Connection[Any], trigger: _Claimed, failure: Failure, processed: Processed, now: datetime
) -> None:
    """Write a trigger's failed attempt (its row locked by the caller): due again after the backoff, or
    given up ``failed``; counted and logged."""
    rule: ActiveRule | None = failure.about
    error = f"rule {rule.id}: {failure.error!r}" if rule is not None else repr(failure.error)
    params = {
        "id": trigger.id,
        "error": error[:1000],
        "next_attempt_at": failure.retry_at(now),
        "given_up": failure.given_up,
        "now": now,
    }
    row = conn.execute(QUERIES["mark_failed"], params).fetchone()
    assert row is not None
    attempts, _ = row
    given_up = failure.given_up
    processed.outcomes[(trigger.type, "failed" if given_up else "retry")] += 1
    log.log(
        logging.ERROR if given_up else logging.WARNING,
        "trigger failed; given up" if given_up else "trigger failed; retried later",
        extra={
            "trigger_id": trigger.id,
            "project_id": str(trigger.project_id),
            "contact_id": str(trigger.contact_id),
            "rule_id": str(rule.id) if rule is not None else None,
            "event_type": trigger.type,
            "attempts": attempts,
            "error": repr(failure.error),
        },
        exc_info=failure.error if isinstance(failure.error, BaseException) else None,
    )
