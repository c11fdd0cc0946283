"""The builder's form of a step that routes and sends nothing: a branch (named paths on conditions, with
whether the previous follow-up was read, and ``otherwise``), a wait for a reply (its timeout, reply path and
timeout path) and a split (an experiment's weighted variants, a holdout, a winner); and how the builder
words such a step and its paths.

Inputs carry the definition's field names under the step (``id``, ``paths.0.to``, ``paths.0.when...``,
``variants.1.weight``, ``on_timeout``), so an error of ``validate_definition`` (``definition.steps.3.
paths.0.to``) is shown next to its input. A path's conditions are the rule form's condition builder
(:mod:`.condition_form`) rooted at ``paths.<i>.when``. A target is chosen among the later steps' ids and
``end``; the branch's delay and the wait's timeout are typed as a number and a unit (errors:
``delay_seconds``, ``timeout_seconds``). "Add path", "Add variant", the condition buttons and "Remove" post
the form (``_op``), which comes back with the change and nothing saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libs.common.followups.definition import END, BranchStep, Node, SplitStep, WaitForReplyStep
from libs.common.followups.graph import HOLDOUT
from services.api.dashboard.condition_form import (
    Group,
    edit_group,
    group_from_form,
    group_json,
    group_of,
    summary,
)
from services.api.dashboard.forms import SECOND_UNITS, Form, FormErrors, join_delay, split_delay, whole_number
from services.api.dashboard.render import duration
from services.api.dashboard.sequence_tree import Lane, LaneEnd

#: The routing steps the builder offers, by kind.
CONTROL_KINDS = {
    "branch": "Branch on conditions",
    "wait_for_reply": "Wait for a reply",
    "split": "Split (an experiment)",
}
#: A branch path's filter on the previous follow-up message.
READ_CHOICES = [("", "either"), ("true", "it was read"), ("false", "it was not read")]


@dataclass
class PathRow:
    name: str = ""
    to: str = END
    read: str = ""
    when: Group = field(default_factory=Group)
    #: Each posted condition's path (the positions its name held) -> its path in ``when``.
    posted: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)


@dataclass
class VariantRow:
    name: str = ""
    weight: str = "1"
    to: str = END


@dataclass
class ControlForm:
    kind: str = "branch"
    id: str = ""
    #: A branch's or a split's delay after the previous step; a wait's timeout.
    wait_value: str = "0"
    wait_unit: str = "hours"
    paths: list[PathRow] = field(default_factory=list)
    #: A branch's ``otherwise`` ("": the next step).
    otherwise: str = ""
    #: A wait's reply path ("": a reply stops the enrollment) and timeout path ("": the next step).
    on_reply: str = ""
    on_timeout: str = ""
    experiment: str = ""
    variants: list[VariantRow] = field(default_factory=list)
    holdout_weight: str = "0"
    #: The chosen variant ("": none, still an experiment).
    winner: str = ""

    @classmethod
    def preset(cls, kind: str) -> ControlForm:
        """A new routing step: a branch with one path, a wait of 3 days, a split of two variants."""
        if kind == "wait_for_reply":
            return cls(kind=kind, wait_value="3", wait_unit="days")
        if kind == "split":
            return cls(kind=kind, variants=[VariantRow("a"), VariantRow("b")])
        return cls(kind="branch", paths=[PathRow()])

    @classmethod
    def of_step(cls, node: BranchStep | WaitForReplyStep | SplitStep) -> ControlForm:
        out = cls(id=node.id or "")
        if isinstance(node, WaitForReplyStep):
            out.kind = "wait_for_reply"
            out.wait_value, out.wait_unit = split_delay(node.timeout_seconds, SECOND_UNITS)
            out.on_reply, out.on_timeout = node.on_reply or "", node.on_timeout or ""
            return out
        out.wait_value, out.wait_unit = split_delay(node.delay_seconds, SECOND_UNITS)
        out.wait_value = out.wait_value or "0"
        if isinstance(node, BranchStep):
            out.kind = "branch"
            out.paths = [
                PathRow(
                    name=path.name,
                    to=path.to,
                    read="" if path.read is None else str(path.read).lower(),
                    when=group_of(path.when or {}),
                )
                for path in node.paths
            ]
            out.otherwise = node.otherwise or ""
        else:
            out.kind = "split"
            out.experiment = node.experiment
            out.variants = [VariantRow(v.name, str(v.weight), v.to) for v in node.variants]
            out.holdout_weight = str(node.holdout_weight)
            out.winner = node.winner or ""
        return out

    @classmethod
    def of_form(cls, form: Form) -> ControlForm:
        kind = form.get("kind")
        out = cls(
            kind=kind if kind in CONTROL_KINDS else "branch",
            id=form.get("id"),
            wait_value=form.get("wait_value"),
            wait_unit=form.get("wait_unit") or "hours",
            otherwise=form.get("otherwise"),
            on_reply=form.get("on_reply"),
            on_timeout=form.get("on_timeout"),
            experiment=form.get("experiment"),
            holdout_weight=form.get("holdout_weight"),
            winner=form.get("winner"),
        )
        for i in _indexes(form, "paths"):
            when, posted = group_from_form(form, f"paths.{i}.when")
            out.paths.append(
                PathRow(
                    name=form.get(f"paths.{i}.name"),
                    to=form.get(f"paths.{i}.to"),
                    read=form.get(f"paths.{i}.read"),
                    when=when,
                    posted=posted,
                )
            )
        for i in _indexes(form, "variants"):
            out.variants.append(
                VariantRow(
                    form.get(f"variants.{i}.name"),
                    form.get(f"variants.{i}.weight"),
                    form.get(f"variants.{i}.to"),
                )
            )
        return out

    def apply(self, op: str) -> None:
        """A form button: ``refresh`` (the kind changed), ``add_path``, ``remove_path:<i>``,
        ``add_variant``, ``remove_variant:<i>``, or a path's condition button (``add_leaf:paths.0.when``;
        see :func:`edit_group`)."""
        verb, _, target = op.partition(":")
        if verb == "refresh":  # the kind changed: a split needs its variants, a branch a path
            if self.kind == "split" and not self.variants:
                self.variants = [VariantRow("a"), VariantRow("b")]
            if self.kind == "branch" and not self.paths:
                self.paths = [PathRow()]
            return
        rows: list[Any] = self.variants if verb.endswith("variant") else self.paths
        if verb == "add_path":
            self.paths.append(PathRow())
        elif verb == "add_variant":
            self.variants.append(VariantRow())
        elif verb in ("remove_path", "remove_variant") and target.isdigit() and int(target) < len(rows):
            del rows[int(target)]
        elif target.startswith("paths."):
            index = target.split(".")[1]
            if index.isdigit() and int(index) < len(self.paths):
                row = self.paths[int(index)]
                edit_group(row.when, row.posted, verb, target, f"paths.{index}.when")

    def payload(self, errors: FormErrors) -> dict[str, Any]:
        """The step as the definition's JSON; what cannot be read is added to ``errors``."""
        out: dict[str, Any] = {"kind": self.kind, "id": self.id.strip() or None}
        if self.kind == "wait_for_reply":
            timeout = join_delay(
                self.wait_value, self.wait_unit, SECOND_UNITS, "timeout_seconds", errors, required=True
            )
            out["timeout_seconds"] = timeout or 0
            out["on_reply"] = self.on_reply or None
            out["on_timeout"] = self.on_timeout or None
            return out
        delay = join_delay(
            self.wait_value, self.wait_unit, SECOND_UNITS, "delay_seconds", errors, required=False
        )
        out["delay_seconds"] = delay or 0
        if self.kind == "branch":
            out["paths"] = [
                {
                    "name": row.name.strip(),
                    "to": row.to,
                    "read": {"true": True, "false": False}.get(row.read),
                    "when": group_json(row.when, f"paths.{i}.when", errors) if row.when.children else None,
                }
                for i, row in enumerate(self.paths)
            ]
            out["otherwise"] = self.otherwise or None
            return out
        out["experiment"] = self.experiment.strip()
        out["variants"] = []
        for i, row in enumerate(self.variants):
            weight = whole_number(row.weight, f"variants.{i}.weight", errors, required=True)
            out["variants"].append({"name": row.name.strip(), "weight": weight or 1, "to": row.to})
        holdout = whole_number(self.holdout_weight, "holdout_weight", errors)
        out["holdout_weight"] = holdout or 0
        out["winner"] = self.winner or None
        return out


def _indexes(form: Form, prefix: str) -> list[int]:
    """The row indexes a posted form has under ``prefix`` (``paths.0.name``, ``paths.2.to``: 0 and 2)."""
    found = {name.split(".")[1] for name in form.items(prefix + ".")}
    return sorted(int(i) for i in found if i.isdigit())


def target_choices(
    steps: list[Node], after: int, default: str | None, current: list[str]
) -> list[tuple[str, str]]:
    """Where a step at ``after`` (in the list as it will be) may send the enrollment: ``default``'s option
    (None: none), ``end``, each later step with an id; and any ``current`` value not among them (a draft's
    target kept as it is, which publishing refuses)."""
    out = [("", default)] if default is not None else []
    out.append((END, f"{END}: the enrollment completes"))
    out += [(node.id, f"step {i + 1} · {node.id}") for i, node in enumerate(steps) if i > after and node.id]
    offered = {value for value, _ in out}
    out += [(value, f"{value} (no later step has this id)") for value in current if value not in offered]
    return out


def control_summary(node: Node) -> str:
    """A routing step in one line, as the builder lists it."""
    if isinstance(node, WaitForReplyStep):
        return f"Waits up to {duration(node.timeout_seconds)} for the contact's reply."
    if isinstance(node, BranchStep):
        when = f"{duration(node.delay_seconds)} after the previous step" if node.delay_seconds else "At once"
        return f"{when}, takes the first path whose conditions hold."
    if isinstance(node, SplitStep):
        when = f"{duration(node.delay_seconds)} after the previous step" if node.delay_seconds else "At once"
        winner = f" Winner chosen: {node.winner}, everyone takes it." if node.winner else ""
        return f"{when}, experiment {node.experiment} assigns each contact a variant by weight.{winner}"
    return ""


def lane_title(lane: Lane, node: Node) -> str:
    """A path's head in the tree: its name and conditions, a reply or its timeout, a variant's share."""
    if lane.kind == "path":
        read: dict[bool | None, str] = {
            True: "; the previous follow-up was read",
            False: "; the previous follow-up was not read",
        }
        return f"Path {lane.name}: when {summary(lane.when)}{read.get(lane.read, '')}"
    if lane.kind == "otherwise":
        return "Otherwise (no path holds)"
    if lane.kind == "reply" and isinstance(node, WaitForReplyStep):
        return f"Replied within {duration(node.timeout_seconds)}"
    if lane.kind == "timeout" and isinstance(node, WaitForReplyStep):
        return f"No reply within {duration(node.timeout_seconds)}"
    if lane.kind == "holdout":
        return f"Holdout ({HOLDOUT}) · weight {lane.weight} · {lane.share:g} %: sent nothing more"
    winner = " · winner" if lane.winner else ""
    return f"Variant {lane.name} · weight {lane.weight} · {lane.share:g} %{winner}"


def end_text(end: LaneEnd, empty: bool) -> str:
    """How a path (or the tree) ends, in words (``empty``: no step down it)."""
    if end.kind == "end":
        return "Ends: the enrollment completes."
    if end.kind == "stop":
        return "A reply stops the enrollment."
    if end.kind == "rejoin" and end.step is not None:
        return f"Goes on at step {end.step + 1}, below." if empty else f"Rejoins at step {end.step + 1}."
    if end.kind == "goto" and end.step is not None:
        return f"Goes to step {end.step + 1}."
    if end.kind == "missing":
        return "Goes to an id no later step has: choose another."
    return ""
