"""A sequence's steps as the builder draws them: a tree derived from the definition's flat list (a pure
function, :func:`tree`).

The list is a graph whose paths go forward (:mod:`libs.common.followups.graph` resolves them): a branch, a
wait for a reply and a split each open paths (:class:`Lane`), and the steps down a path are nested under it
until the path ends, rejoins the others (the first step every continuing path of the step reaches: the
tree goes on there, after the step) or goes to a step drawn elsewhere. A step with one continuing path goes
on below it when its other paths only stop (a reply) or hold out; beside paths that end, the continuing
path's steps are nested under it. Each step is drawn once; a step no
path of the tree reaches from the first is drawn after it, in a :class:`Section` that says which steps go
to it (none: no path reaches it). A draft need not be valid: a target no later step has is drawn as a lane
that goes nowhere (``missing``), which publishing refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final, Literal

from libs.common.followups.definition import (
    BranchStep,
    Definition,
    Node,
    SplitStep,
    WaitForReplyStep,
)
from libs.common.followups.graph import END, HOLDOUT, resolve

#: A reply that stops the enrollment (a wait without ``on_reply``): a target that is no step.
STOP: Final = -2
#: A target no later step has (a draft's): a target that is no step.
MISSING: Final = -3

LaneKind = Literal["path", "otherwise", "reply", "timeout", "variant", "holdout"]
#: How a lane (or the tree's trunk) ends: the enrollment completes (``end``), a reply stops it (``stop``),
#: the paths rejoin at ``step`` (``rejoin``), it goes on at ``step`` drawn elsewhere (``goto``), it ends in
#: the paths of its last step (``paths``), or its target is no later step's id (``missing``).
EndKind = Literal["end", "stop", "rejoin", "goto", "paths", "missing"]


@dataclass(frozen=True)
class LaneEnd:
    kind: EndKind
    #: The step it rejoins or goes to (``rejoin``, ``goto``).
    step: int | None = None
    #: The id it names (``missing``).
    target: str | None = None


@dataclass(frozen=True)
class Lane:
    """One path out of a control step: a branch's path or its ``otherwise``, a wait's reply or timeout path,
    a split's variant or its holdout."""

    kind: LaneKind
    #: The path's or variant's name (none: ``otherwise``, a wait's paths, the holdout).
    name: str | None
    #: The definition field naming its target, under the step (``paths.0.to``, ``on_reply``); none for the
    #: holdout.
    field: str | None
    #: The steps down the path, in the order they go.
    items: list[TreeStep]
    end: LaneEnd
    #: A branch path's conditions and read filter (raw, as the definition has them).
    when: dict[str, object] | None = None
    read: bool | None = None
    #: A variant's (or the holdout's) weight and share of the split, in percent.
    weight: int | None = None
    share: float | None = None
    #: The split's chosen winner.
    winner: bool = False


@dataclass(frozen=True)
class TreeStep:
    """A step where the tree draws it, with the paths it opens (a control step's)."""

    index: int
    step: Node
    lanes: list[Lane] = field(default_factory=list)
    #: Where a control step's continuing paths rejoin (none: they do not, or all end).
    join: int | None = None


@dataclass(frozen=True)
class Section:
    """Steps drawn from one step (the first, or one the first's paths do not reach)."""

    items: list[TreeStep]
    end: LaneEnd
    #: The steps whose paths go to the section's first step (none: no path reaches it).
    reached_from: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Tree:
    #: From the first step; empty for a sequence without steps.
    main: Section
    #: Steps the main section does not draw, each section from the first such step.
    detached: list[Section] = field(default_factory=list)


def _target(definition: Definition, index: int, target: str | None) -> int:
    try:
        return resolve(definition, index, target)
    except ValueError:
        return MISSING


def _lane_targets(definition: Definition, index: int) -> list[tuple[Lane, int]]:
    """A control step's lanes (their items and ends still empty) and where each starts."""
    node = definition.steps[index]
    out: list[tuple[Lane, int]] = []
    empty = LaneEnd("end")
    if isinstance(node, BranchStep):
        for i, path in enumerate(node.paths):
            lane = Lane("path", path.name, f"paths.{i}.to", [], empty, when=path.when, read=path.read)
            out.append((lane, _target(definition, index, path.to)))
        out.append(
            (Lane("otherwise", None, "otherwise", [], empty), _target(definition, index, node.otherwise))
        )
    elif isinstance(node, WaitForReplyStep):
        reply = STOP if node.on_reply is None else _target(definition, index, node.on_reply)
        out.append((Lane("reply", None, "on_reply", [], empty), reply))
        out.append(
            (Lane("timeout", None, "on_timeout", [], empty), _target(definition, index, node.on_timeout))
        )
    elif isinstance(node, SplitStep):
        total = sum(v.weight for v in node.variants) + node.holdout_weight
        for i, variant in enumerate(node.variants):
            lane = Lane(
                "variant",
                variant.name,
                f"variants.{i}.to",
                [],
                empty,
                weight=variant.weight,
                share=round(100 * variant.weight / total, 1),
                winner=variant.name == node.winner,
            )
            out.append((lane, _target(definition, index, variant.to)))
        if node.holdout_weight:
            share = round(100 * node.holdout_weight / total, 1)
            out.append(
                (Lane("holdout", HOLDOUT, None, [], empty, weight=node.holdout_weight, share=share), END)
            )
    return out


def successors(definition: Definition, index: int) -> list[int]:
    """The steps step ``index`` may go to (its targets that are steps)."""
    node = definition.steps[index]
    if isinstance(node, BranchStep | WaitForReplyStep | SplitStep):
        targets = [target for _, target in _lane_targets(definition, index)]
    else:
        targets = [_target(definition, index, node.next)]
    return [t for t in targets if t >= 0]


def tree(definition: Definition) -> Tree:
    """The steps of ``definition`` as a tree (see the module)."""
    return _Walk(definition).run()


class _Walk:
    def __init__(self, definition: Definition) -> None:
        self.definition = definition
        count = len(definition.steps)
        self.next: list[list[int]] = [successors(definition, i) for i in range(count)]
        # the steps each step reaches (itself too), latest first: targets lie after their step
        self.reach: list[frozenset[int]] = [frozenset()] * count
        for i in reversed(range(count)):
            self.reach[i] = frozenset({i}).union(*(self.reach[t] for t in self.next[i] if t > i))
        self.placed: set[int] = set()

    def run(self) -> Tree:
        if not self.definition.steps:
            return Tree(Section([], LaneEnd("end")))
        items, end = self.walk(0, ())
        main = Section(items, end)
        detached = []
        for index in range(len(self.definition.steps)):
            if index in self.placed:
                continue
            items, end = self.walk(index, ())
            sources = [i for i, targets in enumerate(self.next) if index in targets]
            detached.append(Section(items, end, sources))
        return Tree(main, detached)

    def join(self, continuing: list[int]) -> int | None:
        """Where paths starting at ``continuing`` rejoin: the first step every one reaches."""
        if not continuing:
            return None
        common = frozenset.intersection(*(self.reach[t] for t in continuing))
        return min(common) if common else None

    def walk(self, start: int, stops: tuple[int, ...]) -> tuple[list[TreeStep], LaneEnd]:
        """The steps from ``start`` until the path ends, reaches the join of a step it is drawn under
        (``stops``, the nearest last), or a step already drawn."""
        items: list[TreeStep] = []
        at = start
        while True:
            if at == END:
                return items, LaneEnd("end")
            if at == STOP:
                return items, LaneEnd("stop")
            if at == MISSING:
                return items, LaneEnd("missing")
            if stops and at == stops[-1]:
                return items, LaneEnd("rejoin", at)
            if at in self.placed or (stops and at >= min(stops)):
                return items, LaneEnd("goto", at)
            self.placed.add(at)
            node = self.definition.steps[at]
            if not isinstance(node, BranchStep | WaitForReplyStep | SplitStep):
                items.append(TreeStep(at, node))
                at = _target(self.definition, at, node.next)
                continue
            targets = _lane_targets(self.definition, at)
            continuing = [t for _, t in targets if t >= 0]
            # one path goes on: below the step when the others only stop (a reply) or hold out, else under
            # its own head beside the paths that end
            quiet = all(t >= 0 or t == STOP or lane.kind == "holdout" for lane, t in targets)
            joined = self.join(continuing) if len(continuing) > 1 or quiet else None
            inner = stops if joined is None else (*stops, joined)
            lanes = []
            for lane, target in targets:
                lane_items, lane_end = self.walk(target, inner)
                lanes.append(replace(lane, items=lane_items, end=lane_end))
            items.append(TreeStep(at, node, lanes, joined))
            if joined is None:
                return items, LaneEnd("paths")
            at = joined
