"""A rule's conditions as evaluated over a trigger: each node's result and each condition's value, the one
home of that reading for a dry run (:mod:`~libs.common.rules.dry_run`), a rule run (the triggers service,
at event time) and a delayed rule's execution (the sweep, when it falls due).

The product has no evaluator of conditions in Python: the SQL a tree compiles to (its
:func:`~libs.common.platform.conditions.compile_conditions`) is the evaluator. A trace reads, in ONE statement
over the triggers' context (:func:`~libs.common.rules.matching.evaluate`), every node of the tree compiled
alone by the same compiler and written in with :func:`~libs.common.rules.matching.inline` (each leaf and each
group), and each leaf's value (the attribute's own expression, as JSON:
:func:`~libs.common.platform.conditions.value_of`). The root's text is the rule's predicate as the triggers
service matches it: its result is the rule's verdict.

Results are never NULL: the compiler wraps every leaf in ``coalesce(..., false)`` (a value that is absent
makes a leaf false), a negative operator is ``NOT`` of its never-NULL positive, and a group is ``AND`` /
``OR`` of never-NULL children (an empty ``all`` is true, an empty ``any`` false). So each group's result is
exactly ``all`` / ``any`` of its children's.

What a run keeps is compact (:class:`Recorded`): the tree as it was evaluated (the rule may change
afterwards), each node's result in walk order and each leaf's value; :func:`expand` makes it the tree of
results again, :func:`summary` the one line a list shows.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import msgspec
from psycopg import Connection

from libs.common.platform.conditions import Group, Leaf, Node, compile_conditions, parse_conditions, value_of
from libs.common.rules.episodes import EpisodeKind
from libs.common.rules.matching import evaluate, inline

#: Where a tree's nodes are named from (``conditions.all.1.any.0``, as errors name them).
ROOT = "conditions"


class LeafResult(msgspec.Struct, kw_only=True, frozen=True, tag_field="node", tag="leaf"):
    """A condition, the value it compared and whether it holds."""

    #: Where the node is in the tree, as errors name it (``conditions.all.1.any.0``).
    path: str
    attribute: str
    operator: str
    #: The condition's value (null: an operator without one).
    value: Any = None
    #: What the context holds for the attribute, as JSON (null: absent). A custom attribute's stored value
    #: whatever its type; for ``attribute_changed``, the event's change of the attribute (``{from, to}``).
    actual: Any = None
    result: bool


class GroupResult(msgspec.Struct, kw_only=True, frozen=True, tag_field="node", tag="group"):
    """An ``all`` / ``any`` group and whether it holds."""

    path: str
    kind: Literal["all", "any"]
    result: bool
    children: list[GroupResult | LeafResult]


#: A node of the evaluated tree.
ConditionResult = GroupResult | LeafResult


class DelayedRun(msgspec.Struct, kw_only=True, frozen=True):
    """The pending execution a delayed rule that matched records (or would: a dry run's): its episode and
    due time."""

    episode_kind: EpisodeKind
    #: The episode's key (a dry run's ``event`` episode: null, every event is an episode of its own, keyed by
    #: its trigger, which a dry run does not keep).
    episode_key: str | None
    due_at: datetime


class Recorded(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A trace as a run keeps it: the tree evaluated (as stored: the rule may change afterwards), each
    node's result in walk order (the parent before its children) and each leaf's value in the same order;
    a delayed rule's run, the episode it belongs to."""

    conditions: Any
    results: list[bool]
    actuals: list[Any]
    delayed: DelayedRun | None = None

    @property
    def holds(self) -> bool:
        """The root's result: the rule's verdict."""
        return self.results[0]


def trace(
    conn: Connection[Any], project_id: uuid.UUID, root: Node, trigger_id: int
) -> ConditionResult | None:
    """Every node of ``root`` (and each leaf's value) over the context of the project's recorded trigger
    ``trigger_id``, in ONE statement: the tree with each result (None when the trigger's contact is gone)."""
    found = record(conn, project_id, root, [trigger_id]).get(trigger_id)
    return None if found is None else expand(found)


def record(
    conn: Connection[Any], project_id: uuid.UUID, root: Node, trigger_ids: list[int]
) -> dict[int, Recorded]:
    """The trace of ``root`` over each of the project's triggers ``trigger_ids``, in ONE statement, as a
    run keeps it (a trigger whose contact is gone is left out)."""
    return record_all(conn, project_id, [(root, trigger_ids)])[0]


def record_all(
    conn: Connection[Any], project_id: uuid.UUID, wanted: list[tuple[Node, list[int]]]
) -> list[dict[int, Recorded]]:
    """:func:`record` for several trees, each over its triggers, in their order: together in one statement
    (as many as keep its text under ``matching.MAX_STATEMENT_CHARS``), so a batch's matched rules cost one
    round trip and one read of each trigger's context, not one of each per rule."""
    traced = [(root, ids) for root, ids in wanted if ids]
    texts = [_STATEMENTS.texts(conn, root) for root, _ in traced]
    rules = [(p, v, ids) for (_, p, v), (_, ids) in zip(texts, traced, strict=True)]
    found = evaluate(conn, project_id, rules)
    recorded = iter(
        {
            trigger_id: Recorded(conditions=conditions, results=results, actuals=actuals)
            for trigger_id, (results, actuals) in by_trigger.items()
        }
        for (conditions, _, _), by_trigger in zip(texts, found, strict=True)
    )
    return [next(recorded) if ids else {} for _, ids in wanted]


#: Most nodes a rule may have for its matching column to carry its trace (:class:`TracedMatch`). The
#: executor sets up a statement's every expression at each run, whether or not it is evaluated: a big rule's
#: trace (its every node and value) would cost every batch of its project, though few hold; it is read
#: apart, over the triggers it held for.
TRACED_NODES = 16


@dataclass(frozen=True)
class TracedMatch:
    """A rule's column in a statement that traces as it matches (the triggers service's matching: one
    statement, prepared once per connection, reads each trigger's context once for the verdict and the
    trace of every rule): NULL over a trigger the rule does not hold for, else the rest of its trace, a JSON
    array of each node's result after the root's (which holds), then each leaf's value. A trace read apart
    (:func:`record_all`) is a statement of its own, parsed and planned at each batch: it cost a batch more
    than its matching. A rule of more than :data:`TRACED_NODES` nodes carries none (an empty array where it
    holds): its trace is read apart."""

    #: The column's SQL text.
    column: str
    #: The tree as stored, for :class:`Recorded`.
    conditions: Any
    #: How many nodes the tree has.
    nodes: int
    #: Whether the column carries the trace (the tree has at most :data:`TRACED_NODES` nodes).
    carries_trace: bool

    def recorded(self, found: list[Any]) -> Recorded | None:
        """The trace a column read back (not NULL: the rule holds) stands for; None when it carries none."""
        if not self.carries_trace:
            return None
        rest = self.nodes - 1
        return Recorded(conditions=self.conditions, results=[True, *found[:rest]], actuals=found[rest:])


def traced_match(conn: Connection[Any], root: Node) -> TracedMatch:
    """``root``'s column in a matching statement that traces (:class:`TracedMatch`): the root's predicate (the
    rule's, as :func:`~libs.common.rules.matching.match` evaluates it) guards the rest of its trace, which is
    evaluated only over the triggers it holds for."""
    nodes = sum(1 for _ in walk(root))
    if nodes > TRACED_NODES:  # only its predicate, compiled now: its trace's texts when it first holds
        column = f"CASE WHEN {inline(conn, *compile_conditions(root))} THEN '[]'::jsonb END"
        return TracedMatch(column=column, conditions=root.to_json(), nodes=nodes, carries_trace=False)
    conditions, predicates, values = _STATEMENTS.texts(conn, root)
    rest = [f"to_jsonb({predicate})" for predicate in predicates[1:]] + values
    column = f"CASE WHEN {predicates[0]} THEN to_jsonb(ARRAY[{', '.join(rest)}]::jsonb[]) END"
    return TracedMatch(column=column, conditions=conditions, nodes=nodes, carries_trace=True)


class _Statements:
    """Each tree's node predicates and leaf values written in (what a trace evaluates), made once per tree
    object and kept for the last :data:`KEPT_TREES` trees: a cached rule's tree (:class:`~.rules.ActiveRule`)
    stays the same object while the rule does, so the triggers service and the sweep compile a rule's trace
    once, not at every batch (a few milliseconds a rule)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[int, tuple[Node, Any, list[str], list[str]]] = OrderedDict()

    def texts(self, conn: Connection[Any], root: Node) -> tuple[Any, list[str], list[str]]:
        """The tree as stored, its nodes' predicates in walk order and its leaves' values."""
        with self._lock:
            found = self._kept.get(id(root))
            if found is not None and found[0] is root:
                self._kept.move_to_end(id(root))
                return found[1:]
        walked = [node for _, node in walk(root)]
        predicates = [inline(conn, *compile_conditions(node)) for node in walked]
        values = [inline(conn, *value_of(node)) for node in walked if isinstance(node, Leaf)]
        made = (root, root.to_json(), predicates, values)
        with self._lock:
            self._kept[id(root)] = made
            while len(self._kept) > KEPT_TREES:
                self._kept.popitem(last=False)
        return made[1:]


#: How many trees' trace statements a process keeps (those of its rules: a project has at most a few
#: hundred).
KEPT_TREES = 2_000
_STATEMENTS = _Statements()


def walk(node: Node, path: str = ROOT) -> Iterator[tuple[str, Node]]:
    """Each node of a tree with its path, the parent before its children (the order :func:`expand` reads)."""
    yield path, node
    if isinstance(node, Group):
        for i, child in enumerate(node.children):
            yield from walk(child, f"{path}.{node.kind}.{i}")


def expand(recorded: Recorded) -> ConditionResult:
    """The tree of results a run's :class:`Recorded` trace stands for."""
    root = parse_conditions(recorded.conditions, stored=True)
    return _tree(root, ROOT, iter(recorded.results), iter(recorded.actuals))


def _tree(node: Node, path: str, results: Iterator[bool], actuals: Iterator[Any]) -> ConditionResult:
    result = next(results)
    if isinstance(node, Group):
        children = [
            _tree(child, f"{path}.{node.kind}.{i}", results, actuals) for i, child in enumerate(node.children)
        ]
        return GroupResult(path=path, kind=node.kind, result=result, children=children)
    return LeafResult(
        path=path,
        attribute=node.attribute,
        operator=node.operator,
        value=node.value,
        actual=next(actuals),
        result=result,
    )


#: How many conditions that did not hold a summary names.
SUMMARY_LEAVES = 3


def summary(tree: ConditionResult) -> str:
    """One line for a list: ``all 3 conditions held`` (``its condition held``), or the conditions that did
    not hold with the value each compared (``contact.tags = ["vip"] does not contain "demo"``), at most
    :data:`SUMMARY_LEAVES`."""
    leaves = list(_leaves(tree))
    failed = [leaf for leaf in leaves if not leaf.result]
    if not failed:
        if len(leaves) == 1:
            return "its condition held"
        return f"all {len(leaves)} conditions held" if leaves else "no conditions"
    said = "; ".join(explain(leaf) for leaf in failed[:SUMMARY_LEAVES])
    more = len(failed) - SUMMARY_LEAVES
    held = f"{len(leaves) - len(failed)}/{len(leaves)} held"
    return f"{held}: {said}" + (f" (and {more} more)" if more > 0 else "")


def explain(leaf: LeafResult) -> str:
    """A condition in words, with the value it compared: ``contact.tags = ["vip"] does not contain "demo"``
    (a condition that held reads as its operator, one that did not as its negation)."""
    actual = "absent" if leaf.actual is None else _json(leaf.actual)
    operator = leaf.operator if leaf.result else _NOT.get(leaf.operator, f"not {leaf.operator}")
    words = operator.replace("_", " ")
    value = "" if leaf.value is None else f" {_json(leaf.value)}"
    return f"{leaf.attribute} = {actual} {words}{value}"


#: Each operator's negation, as a condition that did not hold reads.
_NOT = {
    "equal_to": "not_equal_to",
    "not_equal_to": "equal_to",
    "contains": "does_not_contain",
    "does_not_contain": "contains",
    "in": "not_in",
    "not_in": "in",
    "is_present": "is_not_present",
    "is_not_present": "is_present",
    "starts_with": "does_not_start_with",
    "is_greater_than": "is_not_greater_than",
    "is_less_than": "is_not_less_than",
    "attribute_changed": "did_not_change_as",
}


def _leaves(node: ConditionResult) -> Iterator[LeafResult]:
    if isinstance(node, LeafResult):
        yield node
        return
    for child in node.children:
        yield from _leaves(child)


def _json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= 80 else text[:79] + "…"
