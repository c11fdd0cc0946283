"""What a rule did with its triggers, as a project reads it: the runs list (each run's outcome and the short
form of its trace) and one run with its decision trace (:mod:`~libs.common.rules.trace`): the conditions as
they were evaluated when it ran, for a delayed rule the episode it belonged to and its execution, with the
conditions as re-checked when it fell due and the guard that stopped it (``skip_reason``).

A run is named by its trigger's public id (``trigger_id``: random, it tells nothing of other projects'
volume). Runs and their traces go with their triggers (7 days), executions after 30 days
(:mod:`~libs.common.rules.purge`).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Final, Literal, get_args

import msgspec
from psycopg import Connection
from psycopg.rows import dict_row

from libs.common.core.errors import NotFound
from libs.common.core.reasons import Other, split
from libs.common.core.sql import load_queries
from libs.common.platform.conditions import Event
from libs.common.rules.actions import RuleRefusal
from libs.common.rules.executions import SKIP_REASONS, ExecutionStatus, SkipReason
from libs.common.rules.rules import get_rule
from libs.common.rules.trace import ConditionResult, DelayedRun, Recorded, expand, summary

QUERIES = load_queries("libs.common.rules", "runs.sql")

#: What a rule did with a trigger: ran its actions, recorded a delayed execution, or was refused.
RuleRunOutcome = Literal["executed", "scheduled", "rejected"]
#: The refusals this version records (a stored one it does not know reads as ``other``).
RULE_REFUSALS: Final[frozenset[RuleRefusal]] = frozenset(get_args(RuleRefusal))


class RuleRun(msgspec.Struct, kw_only=True, frozen=True):
    #: The trigger's public id (random: it tells nothing of other projects' volume); the run's id.
    trigger_id: uuid.UUID
    outcome: RuleRunOutcome
    #: Why a ``rejected`` run was refused (null otherwise); ``other`` for a code this version does not know
    #: (its stored text is the detail).
    reason: Literal[RuleRefusal, Other] | None
    #: What the reason is about (the placeholder of ``missing_variable``), if anything.
    reason_detail: str | None
    ran_at: datetime
    #: The trace's short form: ``all 2 conditions held``, or those that did not hold with their values
    #: (null: a run recorded before traces were kept).
    conditions_summary: str | None = None


class ExecutionTrace(msgspec.Struct, kw_only=True, frozen=True):
    """A delayed rule's execution as its run shows it: when it falls (fell) due, what became of it and why,
    and its conditions as re-checked then."""

    id: uuid.UUID
    status: ExecutionStatus
    due_at: datetime
    executed_at: datetime | None
    #: The guard (or the refusal) that stopped it: the execution's ``skip_reason``.
    skip_reason: Literal[SkipReason, Other] | None
    skip_detail: str | None
    message_id: uuid.UUID | None
    #: The conditions as re-checked when it fell due (null: not re-checked: pending, or stopped before, its
    #: rule disabled say).
    conditions: ConditionResult | None


class RuleRunDetail(msgspec.Struct, kw_only=True, frozen=True):
    """One run of a rule and its decision trace."""

    trigger_id: uuid.UUID
    event: Event
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    #: When the event happened.
    occurred_at: datetime
    outcome: RuleRunOutcome
    reason: Literal[RuleRefusal, Other] | None
    reason_detail: str | None
    ran_at: datetime
    #: The conditions as evaluated when it ran: each group's and condition's result, each condition's value
    #: (the dry run's tree); null for a run recorded before traces were kept.
    conditions: ConditionResult | None
    conditions_summary: str | None
    #: A delayed rule's run: the episode it belongs to and the due time it got.
    delayed: DelayedRun | None
    #: A delayed rule's run: its execution (null once pruned, after 30 days).
    execution: ExecutionTrace | None


def rule_runs(
    conn: Connection[Any], project_id: uuid.UUID, rule_id: uuid.UUID, *, limit: int
) -> list[RuleRun]:
    """What the project's rule did with its latest triggers, newest first (404 for another project's)."""
    get_rule(conn, project_id, rule_id)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            QUERIES["rule_runs"], {"project_id": project_id, "rule_id": rule_id, "limit": limit}
        ).fetchall()
    runs = []
    for row in rows:
        reason, detail = split(row.pop("detail"), RULE_REFUSALS)
        recorded = _recorded(row.pop("trace"))
        brief = summary(expand(recorded)) if recorded is not None else None
        runs.append(row | {"reason": reason, "reason_detail": detail, "conditions_summary": brief})
    return msgspec.convert(runs, list[RuleRun])


def rule_run(
    conn: Connection[Any], project_id: uuid.UUID, rule_id: uuid.UUID, run_id: uuid.UUID
) -> RuleRunDetail:
    """One run of the project's rule with its decision trace; 404 (naming ``run_id``) for another rule's or
    project's run, or one pruned with its trigger."""
    get_rule(conn, project_id, rule_id)
    params = {"project_id": project_id, "rule_id": rule_id, "run_id": run_id}
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(QUERIES["rule_run"], params).fetchone()
        if row is None:
            raise NotFound("rule run not found", field="run_id")
        reason, detail = split(row.pop("detail"), RULE_REFUSALS)
        recorded = _recorded(row.pop("trace"))
        tree = expand(recorded) if recorded is not None else None
        delayed = recorded.delayed if recorded is not None else None
        execution = None
        if delayed is not None and delayed.episode_key is not None:
            found = params | {"conversation_id": row["conversation_id"], "episode_key": delayed.episode_key}
            execution = cur.execute(QUERIES["run_execution"], found).fetchone()
    return RuleRunDetail(
        **row,
        reason=reason,
        reason_detail=detail,
        conditions=tree,
        conditions_summary=summary(tree) if tree is not None else None,
        delayed=delayed,
        execution=_execution(execution) if execution is not None else None,
    )


def _recorded(stored: Any) -> Recorded | None:
    return None if stored is None else msgspec.convert(stored, Recorded)


def _execution(row: dict[str, Any]) -> ExecutionTrace:
    reason, detail = split(row.pop("skip_reason"), SKIP_REASONS)
    recorded = _recorded(row.pop("trace"))
    return ExecutionTrace(
        **row,
        skip_reason=reason,
        skip_detail=detail,
        conditions=expand(recorded) if recorded is not None else None,
    )
