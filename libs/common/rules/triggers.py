"""Triggers: an event that may fire rules, recorded in the event's own transaction, then matched and acted
on by the triggers service.

1. :func:`record_trigger` writes a small ``followup_triggers`` row only when the project has an active rule
   for the event (the per-process rule cache answers), with the conversation's anchors of that moment.
   Only changes made by people and platforms record triggers: actions of rules and follow-up steps never
   call it, so rules never fire rules (the loop guard).
2. :func:`process_triggers` claims a batch in turns across projects (:data:`TURNS`: each project at most
   its share, ``FOR UPDATE SKIP LOCKED``), settles each (project, event) group in a SAVEPOINT of its own
   (its rules' conditions matched in prepared statements: :mod:`libs.common.rules.matching`; a group that
   fails is settled trigger by trigger, and the trigger that fails alone backs off alone; a group whose
   big rule set is still compiling in the background waits, due as it was), and runs each matching rule's
   actions as if in a SAVEPOINT of its own (each trigger in a transaction of its own): a trigger's rules
   run together under one savepoint first, and one by one in savepoints of their own only when one of
   them is refused or fails (:func:`_run`). A business refusal is an outcome (``rejected``); an unexpected
   error rolls the rule back and retries the trigger with backoff, skipping the rules that already ran
   (``rule_runs``), and gives up after :data:`MAX_ATTEMPTS` (``failed``).

Round trips are what a trigger costs (each one a wake-up of the database's backend and of the worker): a
group's reads go out together and so do its writes; a leased trigger's transaction is a round trip for its
BEGIN (psycopg waits for it), one for the lease's lock, the rules' savepoint, their runs, the trigger's mark
and its actions' writes (an action that reads before it writes, a conversation's lock, adds its own), then
the COMMIT.

Each trigger is counted in ``whatstig_followup_triggers_total{type,outcome}`` once the batch committed, per
rule it met: ``executed``, ``rejected``, ``not_matched``, ``delayed``; per trigger: ``no_rule`` (no active
rule any more), ``retry``, ``failed``.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, LiteralString

import msgspec
import psycopg
from psycopg import Connection, Cursor
from psycopg.rows import class_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.core.db import buffered_pipeline
from libs.common.core.effects import NudgeTriggers, Savepoint, after_commit, savepoint
from libs.common.core.jobs import (
    STANDARD_BACKOFF,
    Failed,
    Failure,
    Fairness,
    OwnTransactions,
    Retry,
    RoundRobin,
    claim_in_turns,
    run_batch,
)
from libs.common.core.metrics import FOLLOWUP_TRIGGERS, TRIGGER_RULES_RUN_AGAIN
from libs.common.core.reasons import stored
from libs.common.core.runtime import Runtime
from libs.common.core.sql import load_queries, of_one
from libs.common.followups.stops import count_stopped
from libs.common.rules.actions import (
    BUSINESS_ERRORS,
    Done,
    RuleRefusal,
    Subject,
    refusal_of,
    run_actions,
    send_actions,
)
from libs.common.rules.executions import ToSchedule, schedule
from libs.common.rules.matching import matched, send_match
from libs.common.rules.rules import RULES, ActiveRule
from libs.common.rules.runs import RuleRunOutcome
from libs.common.rules.trace import DelayedRun, Recorded, record_all

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.rules", "triggers.sql")
#: A trigger marked processed as it runs (the claim's settle marks many): planned once per connection.
MARK_ONE_PROCESSED = of_one(QUERIES["mark_processed"])
#: Sent first with a group's statements: they run on the generic plans their prepared statements keep,
#: not planned again at each batch. A project's matching statements are long (its rules' predicates and
#: traces, up to 256 KB a statement), and PostgreSQL plans a prepared statement anew at each run while it
#: estimates that cheaper than its generic plan, as it mostly did for these; each of them finds its rows
#: by the project's key and the triggers' ids, whatever the values. It holds until the claim's transaction
#: ends (or the group's savepoint is rolled back).
GENERIC_PLANS: LiteralString = "SET LOCAL plan_cache_mode = force_generic_plan"

#: How a trigger whose rule keeps failing is retried: 30 s, doubling, at most an hour; given up after the
#: fifth attempt.
RETRY = Retry(max_attempts=5, backoff=STANDARD_BACKOFF)
#: Attempts before a trigger whose rule keeps failing is given up.
MAX_ATTEMPTS = RETRY.max_attempts
#: The first backoff of a failed trigger.
BACKOFF_MIN = STANDARD_BACKOFF.first
#: How long a claimed trigger is kept from other workers while its rules run.
LEASE = timedelta(minutes=2)
#: Where this process's trigger claims resume: in turns across the projects with pending triggers.
TURNS = RoundRobin()


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
    if not RULES.listens(conn, project_id, event):
        return None
    recorded = insert_trigger(
        conn,
        project_id,
        event,
        contact_id=contact_id,
        conversation_id=conversation_id,
        payload=payload,
        now=now,
    )
    after_commit(conn, NudgeTriggers(project_id))  # the triggers service acts on it once it committed
    return recorded.trigger_public_id


def insert_trigger(
    conn: Connection[Any],
    project_id: uuid.UUID,
    event: str,
    *,
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID | None = None,
    payload: dict[str, Any] | None = None,
    now: datetime,
) -> Subject:
    """Write a trigger row for ``event`` with the conversation's anchors of this moment, whether or not a
    rule listens, and nudge nobody: :func:`record_trigger`'s insert, and a dry run's (which rolls it back).
    Returns what the trigger is about, as its rules' actions see it."""
    params = {
        "project_id": project_id,
        "type": event,
        "contact_id": contact_id,
        "conversation_id": conversation_id,
        "payload": Jsonb(payload or {}),
        "now": now,
    }
    with conn.cursor(row_factory=class_row(_Claimed)) as cur:
        row = cur.execute(QUERIES["insert_trigger"], params).fetchone()
    assert row is not None
    return _subject(row)


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
    run_batch(batch, limit=limit, fairness=TURNS)
    if not batch.ids:
        return processed
    processed.triggers = len(batch.ids)
    processed.trigger_ids = batch.ids
    for (kind, outcome), count in processed.outcomes.items():
        FOLLOWUP_TRIGGERS.labels(kind, outcome).inc(count)
    for stopped in processed.done.stopped:
        count_stopped(stopped)
    return processed


#: A leased trigger, the rules it runs, and each one's trace (by rule) as matched.
_ToRun = tuple[_Claimed, list[ActiveRule], dict[uuid.UUID, Recorded | None]]


class _Batch(OwnTransactions[_ToRun]):
    """The triggers queue: a claimed batch, each leased trigger then run in a transaction of its own."""

    retry = RETRY

    def __init__(
        self, pool: ConnectionPool, now: datetime, processed: Processed, runtime: Runtime | None
    ) -> None:
        self.pool = pool
        self.runtime = runtime
        self.now = now
        self.processed = processed
        self.until = now + LEASE
        #: Every trigger the claim took (matched or not).
        self.ids: list[int] = []

    def claim(self, limit: int, fairness: Fairness) -> list[_ToRun]:
        return _claim(self, limit, fairness)

    def run(self, ctx: Connection[Any], item: _ToRun) -> Failed | None:
        trigger, rules, traces = item
        return _run(ctx, trigger, rules, traces, self.until, self.processed, self.now)

    def attempt(self, item: _ToRun) -> int:
        return item[0].attempts + 1

    def record(self, ctx: Connection[Any], item: _ToRun, failure: Failure) -> bool:
        return _failed(ctx, item[0], self.until, failure, self.processed, self.now)

    def describe(self, item: _ToRun) -> dict[str, Any]:
        trigger = item[0]
        return {"trigger_id": trigger.id, "project_id": str(trigger.project_id), "event_type": trigger.type}


def _claim(batch: _Batch, limit: int, fairness: Fairness) -> list[_ToRun]:
    """Claim a batch of due triggers in one transaction, in turns across projects: each (project, event)
    group is settled in a SAVEPOINT of its own (:func:`_settle`): its triggers that no rule matched (or whose
    delayed rules only schedule) are processed at once, the others leased until ``batch.until``; returns
    those, with the rules each runs. ``batch.ids`` receives every trigger claimed."""
    with batch.pool.connection() as conn:
        params = {"now": batch.now} | fairness.params(limit)
        claimed = claim_in_turns(
            conn, QUERIES["trigger_shares"], QUERIES["claim_triggers"], params, class_row(_Claimed)
        )
        if not claimed:
            return []
        fairness.served(list(dict.fromkeys(t.project_id for t in claimed)))
        batch.ids += [t.id for t in claimed]
        groups: dict[tuple[uuid.UUID, str], list[_Claimed]] = {}
        for trigger in claimed:
            groups.setdefault((trigger.project_id, trigger.type), []).append(trigger)
        to_run = [item for group in groups.values() for item in _settle(conn, group, batch)]
    return to_run


def _settle(conn: Connection[Any], group: list[_Claimed], batch: _Batch) -> list[_ToRun]:
    """Match one (project, event) group's triggers against the project's rules, schedule the delayed ones
    that match, mark processed the triggers left with nothing to run and lease the others (until
    ``batch.until``), in a SAVEPOINT; returns those with the rules each runs. When it fails (any error: a
    statement's included), each trigger is settled alone, and the one that fails alone is backed off alone
    (or given up): one project's failing match never holds up another's triggers, nor its own other ones."""
    outcomes: Counter[tuple[str, str]] = Counter()
    settling = Savepoint(conn, "settle")
    settling.open()
    try:
        to_run = _settle_group(conn, group, batch, outcomes, settling)
    except Exception as exc:
        settling.rollback()
        if len(group) > 1:
            return [item for trigger in group for item in _settle(conn, [trigger], batch)]
        trigger = group[0]
        _write_failure(conn, trigger, RETRY.failure(exc, trigger.attempts + 1), batch.processed, batch.now)
        return []
    if to_run is None:  # its rules are being compiled: left to a later batch
        deferred = {t.id for t in group}
        batch.ids[:] = [i for i in batch.ids if i not in deferred]
        return []
    batch.processed.outcomes += outcomes
    return to_run


def _settle_group(
    conn: Connection[Any],
    group: list[_Claimed],
    batch: _Batch,
    outcomes: Counter[tuple[str, str]],
    settling: Savepoint,
) -> list[_ToRun] | None:
    """:func:`_settle`'s work in its savepoint ``settling``, released with the group's last writes. Its
    reads go out together (one round trip), and so do its writes."""
    project_id, kind, now = group[0].project_id, group[0].type, batch.now
    rules = RULES.ready(conn, project_id, kind, batch.pool)
    if rules is None:
        settling.release()
        return None  # compiled in the background meanwhile: the group waits for a later batch, due as it was
    ids = [t.id for t in group]
    with buffered_pipeline(conn):
        conn.execute(GENERIC_PLANS)
        done_before = conn.execute(QUERIES["already_run"], {"project_id": project_id, "ids": ids})
        matching = send_match(conn, project_id, ids, [rule.traced.column for rule in rules])
    already = {(t, r) for t, r in done_before.fetchall()}
    matches = matched(ids, matching)
    chosen: list[tuple[_Claimed, list[ActiveRule]]] = []
    delayed: list[ToSchedule] = []
    traces: dict[int, dict[uuid.UUID, Recorded | None]] = {}
    for trigger in group:
        traced = traces[trigger.id] = {}
        now_run = _to_run(trigger, rules, matches, already, delayed, outcomes, traced)
        if now_run:
            chosen.append((trigger, now_run))
    _traces_apart(conn, project_id, rules, traces)
    to_run = [(trigger, now_run, traces[trigger.id]) for trigger, now_run in chosen]
    runs: list[dict[str, Any]] = []
    if delayed:
        runs = [
            _rule_run(
                {"trigger_id": item.subject.trigger_id, "rule_id": str(item.rule.id)},
                "scheduled",
                trace=traces.get(item.subject.trigger_id, {}).get(item.rule.id),
                delayed=scheduled,
            )
            for item, scheduled in schedule(conn, project_id, delayed, now=now)
        ]
    running = [trigger.id for trigger, _ in chosen]
    settled = [t.id for t in group if t.id not in running]
    project = {"project_id": project_id, "now": now}
    with buffered_pipeline(conn):
        if runs:
            conn.execute(QUERIES["insert_rule_runs"], project | {"runs": Jsonb(runs)})
        if settled:
            conn.execute(QUERIES["mark_processed"], project | {"ids": settled})
        if running:
            conn.execute(QUERIES["lease"], {"project_id": project_id, "ids": running, "until": batch.until})
        settling.release()
    return to_run


def _traces_apart(
    conn: Connection[Any],
    project_id: uuid.UUID,
    rules: list[ActiveRule],
    traces: dict[int, dict[uuid.UUID, Recorded | None]],
) -> None:
    """The traces of the big rules that held (their matching columns carry none:
    :class:`~libs.common.rules.trace.TracedMatch`), each over the triggers it held for, read in one statement
    into ``traces`` (a trigger whose contact is gone meanwhile keeps none)."""
    apart = [
        (rule, [trigger_id for trigger_id, by_rule in traces.items() if rule.id in by_rule])
        for rule in rules
        if not rule.traced.carries_trace
    ]
    apart = [(rule, trigger_ids) for rule, trigger_ids in apart if trigger_ids]
    if not apart:
        return
    found = record_all(conn, project_id, [(rule.conditions, trigger_ids) for rule, trigger_ids in apart])
    for (rule, _), by_trigger in zip(apart, found, strict=True):
        for trigger_id, recorded in by_trigger.items():
            traces[trigger_id][rule.id] = recorded


def _to_run(
    trigger: _Claimed,
    rules: list[ActiveRule],
    matched: dict[int, list[Any]],
    already: set[tuple[int, uuid.UUID]],
    delayed: list[ToSchedule],
    outcomes: Counter[tuple[str, str]],
    traced: dict[uuid.UUID, Recorded | None],
) -> list[ActiveRule]:
    """The rules whose actions the trigger runs now: those that match and have not run for it yet; the
    delayed ones that match go to ``delayed`` (a pending execution each). The trace of each, as matched
    (:class:`~libs.common.rules.trace.TracedMatch`: None for a big rule's, read apart), goes to ``traced``,
    by rule."""
    results = matched.get(trigger.id)
    if not rules or results is None:  # no active rule any more, or the contact is gone
        outcomes[(trigger.type, "no_rule")] += 1
        return []
    chosen = []
    for rule, found in zip(rules, results, strict=True):
        if (trigger.id, rule.id) in already:
            continue
        if found is None:  # the rule does not hold
            outcomes[(trigger.type, "not_matched")] += 1
            continue
        traced[rule.id] = rule.traced.recorded(found)
        if rule.execution_delay_minutes is not None:
            # a delayed rule waits for its time and re-checks its conditions then
            delayed.append(ToSchedule(rule=rule, subject=_subject(trigger)))
            outcomes[(trigger.type, "delayed")] += 1
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


@dataclass(frozen=True)
class _RuleRan:
    """What one rule did with a trigger: its actions ran (``done``), or were refused (``refusal``)."""

    rule: ActiveRule
    done: Done | None = None
    refusal: Exception | None = None


def _run(
    conn: Connection[Any],
    trigger: _Claimed,
    rules: list[ActiveRule],
    traces: dict[uuid.UUID, Recorded | None],
    until: datetime,
    processed: Processed,
    now: datetime,
) -> Failed | None:
    """Run the rules' actions for one leased trigger, each rule as if in a savepoint of its own, then mark
    it processed; a rule that fails unexpectedly ends the attempt (:class:`Failed`): the rules that ran are
    kept and not run again when it is retried.

    On the bet that every rule executes (the common case), the transaction's first round trip is the
    lease's lock, a savepoint, the rule runs (``executed``) with the trigger's mark, and the rules' actions
    together, with no savepoint of their own: what an action only checks of its writes (a contact's tags, a
    conversation's change) is read once that round trip is answered (:func:`send_actions`); an action that
    reads first (a conversation's lock) adds a round trip of its own. Should the lease be lost, or any rule
    be refused or fail, that savepoint is rolled back (the runs, the mark and the actions with it); the rules
    then run again one by one, each in a savepoint of its own (:func:`_run_each`), and what they did is
    written after them. What is kept is always what rules run one by one would keep."""
    lease = {"project_id": trigger.project_id, "id": trigger.id, "until": until, "attempts": trigger.attempts}
    executed = [_RuleRan(rule, done=Done()) for rule in rules]
    together = Savepoint(conn, "rules")
    subject = _subject(trigger)
    locked: Cursor[Any] | None = None
    error: Exception | None = None
    try:
        with buffered_pipeline(conn):
            locked = conn.execute(QUERIES["lock_leased"], lease)
            together.open()
            rows = [_row(trigger, item, traces) for item in executed]
            _write_runs(conn, trigger, rows, processed=True, now=now)
            sent = [(rule, send_actions(conn, rule.id, rule.actions, subject, now=now)) for rule in rules]
        ran = [_RuleRan(rule, done=actions.checked()) for rule, actions in sent]
    except Exception as exc:  # a refusal or a failure: each rule again in a savepoint of its own (below)
        error = exc
    held = _lease_held(locked, error)
    if error is not None or not held:
        together.rollback()
    if not held:
        return None  # processed meanwhile, or taken over by another worker after the lease ran out
    failed: Failed | None = None
    if error is not None:
        TRIGGER_RULES_RUN_AGAIN.labels(trigger.type).inc()
        log.debug(
            "rules run again one by one",
            extra={"trigger_id": trigger.id, "project_id": str(trigger.project_id), "error": repr(error)},
        )
        ran, failed = _run_each(conn, rules, subject, now)
        with buffered_pipeline(conn):
            rows = [_row(trigger, item, traces) for item in ran]
            _write_runs(conn, trigger, rows, processed=failed is None, now=now)
    for item in ran:
        _count(trigger, item, processed)
    return failed


def _lease_held(locked: Cursor[Any] | None, error: Exception | None) -> bool:
    """Whether the lease's lock found the trigger still this worker's. When the lock has no result (the
    transaction failed at it or before it, so no savepoint was opened), ``error`` is raised: the attempt
    failed."""
    try:
        if locked is not None:
            return locked.fetchone() is not None
    except psycopg.Error:
        pass
    assert error is not None, "the lease's lock has a result unless the pipeline failed"
    raise error


def _write_runs(
    conn: Connection[Any], trigger: _Claimed, runs: list[dict[str, Any]], *, processed: bool, now: datetime
) -> None:
    """Write the trigger's rule runs, and mark it processed when it is."""
    project = {"project_id": trigger.project_id, "now": now}
    if runs:
        conn.execute(QUERIES["insert_rule_runs"], project | {"runs": Jsonb(runs)})
    if processed:
        conn.execute(MARK_ONE_PROCESSED, project | {"id": trigger.id})


def _run_each(
    conn: Connection[Any], rules: list[ActiveRule], subject: Subject, now: datetime
) -> tuple[list[_RuleRan], Failed | None]:
    """Run each rule's actions in a savepoint of its own: a business refusal is the rule's outcome and the
    next rule runs; an unexpected error ends the attempt (:class:`Failed`, about that rule)."""
    ran: list[_RuleRan] = []
    for rule in rules:
        try:
            with savepoint(conn):  # a rule rolled back drops its after-commit effects too
                done = run_actions(conn, rule.id, rule.actions, subject, now=now)
        except BUSINESS_ERRORS as refusal:
            ran.append(_RuleRan(rule, refusal=refusal))
            continue
        except Exception as exc:
            return ran, Failed(exc, about=rule)
        ran.append(_RuleRan(rule, done=done))
    return ran, None


def _row(trigger: _Claimed, item: _RuleRan, traces: dict[uuid.UUID, Recorded | None]) -> dict[str, Any]:
    """A rule's run for ``trigger`` as its row of ``rule_runs``, with its trace as matched."""
    run = {"trigger_id": trigger.id, "rule_id": str(item.rule.id)}
    trace = traces.get(item.rule.id)
    if item.done is None:
        assert item.refusal is not None
        reason, detail = refusal_of(item.refusal)
        return _rule_run(run, "rejected", reason, detail, trace=trace)
    return _rule_run(run, "executed", trace=trace)


def _count(trigger: _Claimed, item: _RuleRan, processed: Processed) -> None:
    """A rule's run for ``trigger`` counted, logged and kept in ``processed``."""
    context = {
        "trigger_id": trigger.id,
        "project_id": str(trigger.project_id),
        "event_type": trigger.type,
        "rule_id": str(item.rule.id),
    }
    if item.done is None:
        assert item.refusal is not None
        reason, _ = refusal_of(item.refusal)
        processed.outcomes[(trigger.type, "rejected")] += 1
        log.info("rule rejected", extra=context | {"reason": reason})
        return
    processed.outcomes[(trigger.type, "executed")] += 1
    processed.done.webhook_delivery_ids += item.done.webhook_delivery_ids
    processed.done.message_ids += item.done.message_ids
    processed.done.stopped += item.done.stopped
    log.info("rule executed", extra=context)


def _rule_run(
    run: dict[str, Any],
    outcome: RuleRunOutcome,
    reason: RuleRefusal | None = None,
    detail: str | None = None,
    *,
    trace: Recorded | None,
    delayed: DelayedRun | None = None,
) -> dict[str, Any]:
    """A row of ``rule_runs`` of the project (``run`` names its trigger and rule): its outcome, a refusal's
    reason stored with its detail (``missing_variable:vars.plan``), and its trace as matched (a delayed
    rule's with the episode it belongs to)."""
    if trace is not None and delayed is not None:
        trace = msgspec.structs.replace(trace, delayed=delayed)
    return run | {
        "outcome": outcome,
        "detail": stored(reason, detail) if reason is not None else None,
        "trace": msgspec.to_builtins(trace) if trace is not None else None,
    }


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
    lease = {"project_id": trigger.project_id, "id": trigger.id, "until": until, "attempts": trigger.attempts}
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
        "project_id": trigger.project_id,
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
