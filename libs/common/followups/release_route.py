"""The release of a step that sends nothing: a branch, a wait for a reply, a split. It decides the path
(:func:`route`); the release step (:mod:`~libs.common.followups.release_step`) records it as the step's
``branched`` run and moves the enrollment there, in the same transaction.

    branch          the paths' conditions, read in ONE statement over the contact (its newest conversation,
                    lead and deal: the segment context), and whether the previous follow-up was read (the
                    release state's read): the first path that holds, else ``otherwise``
    wait_for_reply  released when it times out: a reply since it began takes the reply path (the reply's
                    stop path normally moved it already), else the timeout path
    split           the contact's variant (:func:`~libs.common.followups.graph.assign`), or the winner
                    chosen for the experiment (one indexed read), recorded on the enrollment
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from threading import Lock
from typing import Any, Literal

from psycopg import Connection, sql

from libs.common.core.sql import load_queries
from libs.common.followups import graph, transitions
from libs.common.followups.definition import BranchStep, Definition, SplitStep, WaitForReplyStep
from libs.common.followups.release_claim import ClaimedEnrollment
from libs.common.platform.conditions import SEGMENT_CONTEXT, compile_conditions, parse_segment

QUERIES = load_queries("libs.common.followups", "release_route.sql")

#: Why a step that sends nothing went the way it did (its ``branched`` run's reason; the path's or the
#: variant's name is its detail): a branch's path or ``otherwise``, a wait's reply or timeout, a split's
#: variant or holdout.
RouteReason = Literal["path", "otherwise", "replied", "no_reply", "variant", "holdout"]


@dataclass(frozen=True)
class Route:
    """Where a step that sends nothing sends the enrollment: a step index or :data:`graph.END`, or None:
    stop it (a wait without a reply path, replied to)."""

    reason: RouteReason
    detail: str | None
    target: int | None


def route(
    conn: Connection[Any],
    row: ClaimedEnrollment,
    definition: Definition,
    *,
    replied_at: datetime | None,
    last_message_status: str | None,
) -> Route:
    """The path the enrollment takes from its current step (a branch, a wait or a split)."""
    index = row.step_index
    node = definition.steps[index]
    if isinstance(node, BranchStep):
        held = _conditions_held(conn, row, node)
        holds = [
            graph.path_holds(p.read, h, last_message_status) for p, h in zip(node.paths, held, strict=True)
        ]
        name, target = graph.branch_target(definition, index, holds)
        return Route("path", name, target) if name is not None else Route("otherwise", None, target)
    if isinstance(node, WaitForReplyStep):
        began = row.last_step_at or row.enrolled_at
        if replied_at is not None and replied_at > began:
            return Route("replied", None, graph.wait_target(definition, index, "replied"))
        return Route("no_reply", None, graph.wait_target(definition, index, "no_reply"))
    assert isinstance(node, SplitStep), index
    winner = _winner(conn, row, node.experiment) if row.sequence_id is not None else None
    assignment = graph.assign(definition, index, row.sequence_id, row.contact_id, winner)
    transitions.assign(conn, row.project_id, row.id, assignment.experiment, assignment.variant)
    if assignment.variant == graph.HOLDOUT:
        return Route("holdout", None, assignment.target)
    return Route("variant", assignment.variant, assignment.target)


def _winner(conn: Connection[Any], row: ClaimedEnrollment, experiment: str) -> str | None:
    """The winner chosen for the sequence's experiment, if one was (on any version)."""
    params = {"project_id": row.project_id, "sequence_id": row.sequence_id, "experiment": experiment}
    found = conn.execute(QUERIES["experiment_winner"], params).fetchone()
    return str(found[0]) if found is not None else None


def _conditions_held(conn: Connection[Any], row: ClaimedEnrollment, branch: BranchStep) -> list[bool]:
    """Whether each path's conditions hold for the contact now, in one statement."""
    statement, params = _branch_statement(row.version_id, row.step_index, branch)
    found = conn.execute(statement, [*params, row.project_id, row.contact_id]).fetchone()
    return list(found[0]) if found is not None else [False] * len(branch.paths)


#: Compiled branch statements, by version and step (a version never changes): the most kept.
_MOST_STATEMENTS = 1024
_statements: OrderedDict[tuple[uuid.UUID, int], tuple[sql.Composed, list[Any]]] = OrderedDict()
_statements_lock = Lock()


def _branch_statement(
    version_id: uuid.UUID, index: int, branch: BranchStep
) -> tuple[sql.Composed, list[Any]]:
    """The branch's paths' conditions compiled into one statement over the contact's segment context (its
    parameters, then the project's and the contact's ids)."""
    key = (version_id, index)
    with _statements_lock:
        if key in _statements:
            _statements.move_to_end(key)
            return _statements[key]
    predicates: list[sql.Composable] = []
    params: list[Any] = []
    for path in branch.paths:
        predicate, bound = compile_conditions(parse_segment(path.when))
        predicates.append(sql.SQL("({})").format(predicate))
        params += bound
    statement = sql.SQL("SELECT ARRAY[{}]::boolean[] FROM {} WHERE c.project_id = {} AND c.id = {}").format(
        sql.SQL(", ").join(predicates), SEGMENT_CONTEXT, sql.Placeholder(), sql.Placeholder()
    )
    with _statements_lock:
        _statements[key] = (statement, params)
        while len(_statements) > _MOST_STATEMENTS:
            _statements.popitem(last=False)
    return statement, params
