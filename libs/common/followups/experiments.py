"""Choosing an experiment's winner: the sequence's current version with the split's ``winner`` set is
published as a new version (the draft carries it too), and the choice is recorded in
``followup_experiment_winners``, which the release reads so that an enrollment on an older version that
reaches the split takes the winner as well. Its results are :mod:`~libs.common.followups.statistics`'."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec
from psycopg import Connection

from libs.common.core.errors import Conflict, InvalidInput
from libs.common.core.metrics import FOLLOWUP_EXPERIMENT_WINNERS
from libs.common.followups import sequences
from libs.common.followups.definition import Definition, SplitStep, decode_definition

log = logging.getLogger(__name__)


class WinnerChoice(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: The name of one of the split's variants (not the holdout).
    variant: Annotated[str, msgspec.Meta(max_length=64)]


class Winner(msgspec.Struct, kw_only=True, frozen=True):
    """An experiment's chosen variant, and the version that routes everyone reaching the split to it."""

    sequence_id: uuid.UUID
    experiment: str
    variant: str
    version_id: uuid.UUID
    #: The version's number.
    version: int
    #: When this variant was chosen (choosing it again keeps the time).
    chosen_at: datetime


def _with_winner(definition: Definition, experiment: str, variant: str) -> Definition | None:
    """``definition`` with its split of ``experiment`` won by ``variant`` (None: it has no such split)."""
    steps = list(definition.steps)
    for index, node in enumerate(steps):
        if isinstance(node, SplitStep) and node.experiment == experiment:
            steps[index] = msgspec.structs.replace(node, winner=variant)
            return msgspec.structs.replace(definition, steps=steps)
    return None


def choose_winner(
    conn: Connection[Any],
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    experiment: str,
    choice: WinnerChoice,
    *,
    now: datetime,
) -> tuple[Winner, bool]:
    """Make ``choice.variant`` the winner of the sequence's ``experiment``: the current version with that
    split's winner set is published as a new version (the draft's split gets it too) and the choice is
    recorded. Returns the winner and whether a new version was published: the variant already won in the
    current version makes none (idempotent). 404 for another project's sequence; 409 for an archived one;
    422 naming ``experiment`` (no split of that name in the current version) or ``variant``."""
    status, raw_draft = sequences.lock_sequence(conn, project_id, sequence_id)
    if status == "archived":
        raise Conflict("an archived sequence cannot be published", field="sequence_id")
    sequence = sequences.get_sequence(conn, project_id, sequence_id)
    if sequence.current_version_id is None:
        raise InvalidInput("the sequence has no published version, so no experiment", field="experiment")
    current = sequences.version_definition(conn, project_id, sequence.current_version_id)
    split = next((s for s in current.steps if isinstance(s, SplitStep) and s.experiment == experiment), None)
    if split is None:
        raise InvalidInput(f"the current version has no split named {experiment[:64]}", field="experiment")
    if choice.variant not in {v.name for v in split.variants}:
        names = ", ".join(v.name for v in split.variants)
        raise InvalidInput(
            f"{experiment} has no variant named {choice.variant[:64]} (its variants: {names})",
            field="variant",
        )
    version_id, number = sequence.current_version_id, sequence.current_version or 0
    new = split.winner != choice.variant
    if new:
        won = _with_winner(current, experiment, choice.variant)
        assert won is not None
        version = sequences.publish_definition(conn, project_id, sequence_id, won, now=now)
        version_id, number = version.id, version.version
        draft = _with_winner(decode_definition(raw_draft), experiment, choice.variant)
        if draft is not None:  # a draft that dropped the split keeps its edit
            sequences.set_draft(conn, project_id, sequence_id, draft)
    else:  # the current version names it already: recorded (again), its time kept
        won = current
    recorded = sequences.record_winners(conn, project_id, sequence_id, version_id, won, now=now)[experiment]
    winner = Winner(
        sequence_id=sequence_id,
        experiment=experiment,
        variant=recorded.variant,
        version_id=recorded.version_id,
        version=number,
        chosen_at=recorded.chosen_at,
    )
    FOLLOWUP_EXPERIMENT_WINNERS.labels("chosen" if new else "unchanged").inc()
    log.info(
        "experiment winner chosen",
        extra={
            "project_id": str(project_id),
            "sequence_id": str(sequence_id),
            "experiment": experiment,
            "variant": choice.variant,
            "version_id": str(version_id),
            "version": number,
            "new_version": new,
        },
    )
    return winner, new
