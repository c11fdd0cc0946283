"""Where an enrollment goes after a step: the one home of a sequence's paths, for the release, the reply
path of the stop path, the preview and the statistics.

A definition's steps are a list, each step going to the next unless it names where it goes
(:mod:`~libs.common.followups.definition`): a later step's id, or ``end``. Here a target is resolved to a
step index, or :data:`END` (-1: the enrollment completes). Validation made every target lie after its step,
so following targets always ends.

A split assigns a contact a variant by weight (:func:`assign`): the point is a hash of the sequence, the
experiment and the contact, so the same contact gets the same variant of the same experiment in every
version (re-publishing keeps it) and on every enrollment, and the shares follow the weights.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Final, Literal

from libs.common.followups.definition import (
    END as END_NAME,
)
from libs.common.followups.definition import (
    AiStep,
    BranchStep,
    Definition,
    MessageStep,
    Node,
    SplitStep,
    Step,
    WaitForReplyStep,
)

#: A path that ends: the enrollment completes.
END: Final = -1
#: What a holdout is recorded as, in place of a variant's name.
HOLDOUT: Final = "holdout"


def resolve(definition: Definition, index: int, target: str | None) -> int:
    """Step ``index``'s ``target`` as a step index: None is the next step in the list (or :data:`END` past
    the last), ``end`` is :data:`END`, an id is its step's index."""
    if target is None:
        following = index + 1
        return following if following < len(definition.steps) else END
    if target == END_NAME:
        return END
    for position in range(index + 1, len(definition.steps)):
        if definition.steps[position].id == target:
            return position
    raise ValueError(f"step {index} names {target!r}, which no later step is")  # validation refuses it


def following(definition: Definition, index: int) -> int:
    """Where a sending step goes once run (queued or skipped): its ``next``."""
    step = definition.steps[index]
    assert isinstance(step, MessageStep | AiStep), index
    return resolve(definition, index, step.next)


def branch_target(definition: Definition, index: int, held: list[bool]) -> tuple[str | None, int]:
    """A branch's path for the results of its paths' conditions (``held``, in order): the first that holds
    (its name and where it starts), else ``otherwise`` (no name)."""
    branch = definition.steps[index]
    assert isinstance(branch, BranchStep), index
    for path, holds in zip(branch.paths, held, strict=True):
        if holds:
            return path.name, resolve(definition, index, path.to)
    return None, resolve(definition, index, branch.otherwise)


def path_holds(read: bool | None, conditions_hold: bool, last_message_status: str | None) -> bool:
    """Whether a branch path holds: its conditions, and, when it asks, whether the previous follow-up was
    read (its message's status READ)."""
    return conditions_hold and (read is None or read == (last_message_status == "READ"))


WaitOutcome = Literal["replied", "no_reply"]


def wait_target(definition: Definition, index: int, outcome: WaitOutcome) -> int | None:
    """A wait's path: on a reply its ``on_reply`` (None: the reply stops the enrollment), else
    ``on_timeout``."""
    wait = definition.steps[index]
    assert isinstance(wait, WaitForReplyStep), index
    if outcome == "replied":
        return resolve(definition, index, wait.on_reply) if wait.on_reply is not None else None
    return resolve(definition, index, wait.on_timeout)


def reply_step(definition: Definition, index: int) -> int | None:
    """The step a reply moves an enrollment waiting at step ``index`` to (:data:`END`: it completes), kept
    on the enrollment while it waits; None when a reply stops it (not a wait, or a wait without
    ``on_reply``)."""
    node = definition.steps[index] if 0 <= index < len(definition.steps) else None
    if isinstance(node, WaitForReplyStep):
        return wait_target(definition, index, "replied")
    return None


@dataclass(frozen=True)
class Assignment:
    """A contact's arm of an experiment: a variant's name (or :data:`HOLDOUT`) and where it goes
    (:data:`END` for the holdout: it gets nothing more)."""

    experiment: str
    variant: str
    target: int


#: The points a split is cut into: a weight's share is exact to 1 / 2**64.
_SPACE = 2**64


def point(sequence_id: uuid.UUID | None, experiment: str, contact_id: uuid.UUID) -> float:
    """The contact's point in [0, 1) for the sequence's experiment: the same in every version."""
    digest = hashlib.blake2b(f"{sequence_id}/{experiment}/{contact_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SPACE


def assign(
    definition: Definition,
    index: int,
    sequence_id: uuid.UUID | None,
    contact_id: uuid.UUID,
    winner: str | None = None,
) -> Assignment:
    """The split at ``index``'s arm for the contact: the winner when one was chosen (``winner``, when it is
    one of the split's variants; else the split's own), else by weight, the holdout's last."""
    split = definition.steps[index]
    assert isinstance(split, SplitStep), index
    chosen = winner if any(v.name == winner for v in split.variants) else split.winner
    for variant in split.variants:
        if variant.name == chosen:
            return Assignment(split.experiment, variant.name, resolve(definition, index, variant.to))
    total = sum(v.weight for v in split.variants) + split.holdout_weight
    at = point(sequence_id, split.experiment, contact_id) * total
    reached = 0
    for variant in split.variants:
        reached += variant.weight
        if at < reached:
            return Assignment(split.experiment, variant.name, resolve(definition, index, variant.to))
    return Assignment(split.experiment, HOLDOUT, END)


def sending_step(definition: Definition, index: int) -> Step:
    """The sending step at ``index`` (a message was queued or a step run recorded for it)."""
    step = definition.steps[index]
    assert isinstance(step, MessageStep | AiStep), index
    return step


def is_control(node: Node) -> bool:
    """Whether a step routes the enrollment and sends nothing."""
    return isinstance(node, BranchStep | WaitForReplyStep | SplitStep)
