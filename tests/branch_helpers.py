"""What the branch differential tests share: a plain-Python model of where an enrollment goes through a
sequence's graph, and the Hypothesis strategies drawing the graphs and the contacts' histories.

The model is written from the documented semantics (libs/common/followups/definition.py and graph.py's
docstrings, docs/api.md), not from graph.py, which it is held against:

- the steps are a list; a step goes to the next one in the list unless it names a later step's id or
  ``end``; past the last step the enrollment completes;
- a message step is queued (its step run ``queued``, no reason) and goes to its ``next``; so does an AI
  step, with no model configured: its template fallback is queued (``ai_fallback:model_unavailable``), or,
  with a skip fallback, it is skipped (``ai_unavailable``: no message, the last one queued stays the
  last);
- a branch takes its first path whose ``when`` holds for the contact and whose ``read`` (when given) is
  whether the last follow-up message queued was read; else ``otherwise`` (step run ``branched``, reason
  ``path:<name>`` or ``otherwise``);
- a reply while the enrollment is not at a wait stops it when the sequence stops on a reply (``stopped``,
  ``replied``), and changes nothing else (a later wait began after it: no reply there);
- a wait for a reply: a reply before the timeout takes ``on_reply`` (reason ``replied``), or, without
  one, stops the enrollment as a reply always does (``stopped``/``replied``, no step run: the stop path
  writes none); no reply by the timeout takes ``on_timeout`` (reason ``no_reply``);
- a split takes the winner chosen for its experiment (when it names one of its variants), else its own
  winner when it has one, else the variant whose share of [0, 1) holds the contact's
  point (blake2b, 8 bytes, big-endian, of ``"<sequence id>/<experiment>/<contact id>"`` over 2**64),
  variants in order, the holdout's share last (reason ``variant:<name>``, or ``holdout``: the enrollment
  completes and gets nothing more).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from libs.common.followups.definition import (
    AiStep,
    BranchPath,
    BranchStep,
    Definition,
    MessageStep,
    Node,
    SkipFallback,
    SplitStep,
    StopFlags,
    TemplateFallback,
    Variant,
    WaitForReplyStep,
)

#: The tags a branch's conditions name, and a contact may have.
TAGS = ("t0", "t1", "t2")
#: How long a wait may be (the reply, when there is one, comes a minute after the wait began).
TIMEOUTS = (3600, 86400)
#: A step's delay (message, branch, split).
DELAYS = (0, 0, 600, 3600)

#: An AI step's run with no model configured, its template fallback queued.
FALLBACK = "ai_fallback:model_unavailable"
#: A step run as the model predicts it: (step index, outcome, reason).
Run = tuple[int, str, str | None]
Status = Literal["completed", "stopped"]


@dataclass(frozen=True)
class History:
    """What happens to the contact: its tags (what the branches' conditions read), whether it replies
    while waiting at each step (read at waits only), whether the message queued at each step is read
    before the next step is taken, and whether the contact writes in after it (read at message steps
    only; a message the enrollment leaves for a wait is replied to at the wait, if at all). ``late``: the
    contact had the other tags when it was enrolled, and got these just after (a branch reads the tags the
    contact has when it is taken). ``chosen``: at a split, the winner chosen for its experiment (a
    variant's name, or one no variant of this version has), if one was."""

    tags: frozenset[str]
    replies: tuple[bool, ...]
    reads: tuple[bool, ...]
    writes: tuple[bool, ...]
    late: bool = False
    chosen: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class Walk:
    """Where an enrollment went: its step runs, in order, and how it finished."""

    runs: tuple[Run, ...]
    status: Status
    reason: str | None


# --- the model -------------------------------------------------------------------------------------------


def holds(when: dict[str, Any] | None, tags: frozenset[str]) -> bool:
    """A branch path's ``when`` (as :func:`conditions` draws them: tag leaves in all / any groups) for a
    contact with ``tags``."""
    if when is None:
        return True
    if "all" in when:
        return all(holds(child, tags) for child in when["all"])
    if "any" in when:
        return any(holds(child, tags) for child in when["any"])
    assert when["attribute"] == "contact.tags", when
    found = when["value"] in tags
    return found if when["operator"] == "contains" else not found


def split_point(sequence_id: uuid.UUID, experiment: str, contact_id: uuid.UUID) -> float:
    """The contact's point in [0, 1) for the sequence's experiment, as graph.py's docstring states it."""
    key = f"{sequence_id}/{experiment}/{contact_id}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


def split_arm(
    split: SplitStep, sequence_id: uuid.UUID, contact_id: uuid.UUID, chosen: str | None = None
) -> str | None:
    """The variant's name a contact gets at ``split`` (None: the holdout), ``chosen`` the winner chosen for
    its experiment, if one was."""
    names = [v.name for v in split.variants]
    for winner in (chosen, split.winner):
        if winner in names:
            return winner
    weights = [v.weight for v in split.variants]
    at = split_point(sequence_id, split.experiment, contact_id) * (sum(weights) + split.holdout_weight)
    edge = 0
    for variant, weight in zip(split.variants, weights, strict=True):
        edge += weight
        if at < edge:
            return variant.name
    return None


def model(definition: Definition, history: History, sequence_id: uuid.UUID, contact_id: uuid.UUID) -> Walk:
    """Where the enrollment goes, its step runs and how it finishes, by the documented semantics."""
    steps = definition.steps
    position = {node.id: i for i, node in enumerate(steps) if node.id is not None}

    def to(index: int, target: str | None) -> int:
        """The step a target names (len(steps): the end)."""
        if target is None:
            return index + 1
        return len(steps) if target == "end" else position[target]

    runs: list[Run] = []
    last_read = False  # whether the last message queued was read (none queued: not read)
    index = 0
    while index < len(steps):
        node = steps[index]
        if isinstance(node, MessageStep | AiStep):
            skipped = isinstance(node, AiStep) and isinstance(node.fallback, SkipFallback)
            if skipped:
                runs.append((index, "skipped", "ai_unavailable"))
            else:
                runs.append((index, "queued", None if isinstance(node, MessageStep) else FALLBACK))
                last_read = history.reads[index]
            writes = history.writes[index] and not skipped
            index = to(index, node.next)
            at_wait = index < len(steps) and isinstance(steps[index], WaitForReplyStep)
            if writes and index < len(steps) and not at_wait and definition.stop_on.reply:
                return Walk(tuple(runs), "stopped", "replied")
        elif isinstance(node, BranchStep):
            taken = next(
                (
                    p
                    for p in node.paths
                    if holds(p.when, history.tags) and (p.read is None or p.read == last_read)
                ),
                None,
            )
            runs.append((index, "branched", f"path:{taken.name}" if taken else "otherwise"))
            index = to(index, taken.to if taken else node.otherwise)
        elif isinstance(node, WaitForReplyStep):
            if not history.replies[index]:
                runs.append((index, "branched", "no_reply"))
                index = to(index, node.on_timeout)
            elif node.on_reply is None:
                return Walk(tuple(runs), "stopped", "replied")
            else:
                runs.append((index, "branched", "replied"))
                index = to(index, node.on_reply)
        else:
            assert isinstance(node, SplitStep), node
            arm = split_arm(node, sequence_id, contact_id, history.chosen[index])
            if arm is None:
                runs.append((index, "branched", "holdout"))
                break
            runs.append((index, "branched", f"variant:{arm}"))
            index = to(index, next(v.to for v in node.variants if v.name == arm))
    return Walk(tuple(runs), "completed", None)


# --- the strategies --------------------------------------------------------------------------------------


def step_id(index: int) -> str:
    return f"s{index}"


def _targets(index: int, count: int) -> st.SearchStrategy[str]:
    """Where step ``index`` of ``count`` may go: a later step's id, or ``end``."""
    return st.sampled_from([*(step_id(j) for j in range(index + 1, count)), "end"])


def _or_next(index: int, count: int) -> st.SearchStrategy[str | None]:
    """A later step's id, ``end``, or None (the next step; for ``on_reply``, a stop)."""
    return st.one_of(st.none(), _targets(index, count))


_LEAF = st.builds(
    lambda operator, tag: {"attribute": "contact.tags", "operator": operator, "value": tag},
    st.sampled_from(["contains", "contains", "does_not_contain"]),
    st.sampled_from(TAGS),
)
#: A branch path's ``when``: always, a tag leaf, or a group of them.
CONDITIONS: st.SearchStrategy[dict[str, Any] | None] = st.one_of(
    st.none(),
    _LEAF,
    _LEAF,
    st.tuples(st.sampled_from(["all", "any"]), st.lists(_LEAF, min_size=1, max_size=3)).map(
        lambda group: {group[0]: group[1]}
    ),
)


@st.composite
def _node(draw: st.DrawFn, index: int, count: int, stop_on_reply: bool) -> Node:
    # the first step does not wait for a reply (nothing was sent yet: validation refuses it)
    kind = draw(
        st.sampled_from(["message", "message", "ai", "branch", "split", *(["wait"] if index else [])])
    )
    own = step_id(index)
    if kind == "ai":
        return AiStep(
            id=own,
            instructions=f"write step {index}",
            fallback=SkipFallback() if draw(st.booleans()) else TemplateFallback(text=f"step {index}"),
            delay_seconds=draw(st.sampled_from(DELAYS)),
            next=draw(_or_next(index, count)),
        )
    if kind == "message":
        return MessageStep(
            id=own,
            text=f"step {index}",
            delay_seconds=draw(st.sampled_from(DELAYS)),
            next=draw(_or_next(index, count)),
        )
    if kind == "branch":
        paths = draw(st.integers(1, 3))
        return BranchStep(
            id=own,
            delay_seconds=draw(st.sampled_from(DELAYS)),
            paths=[
                BranchPath(
                    name=f"p{p}",
                    when=draw(CONDITIONS),
                    read=draw(st.sampled_from([None, None, True, False])),
                    to=draw(_targets(index, count)),
                )
                for p in range(paths)
            ],
            otherwise=draw(_or_next(index, count)),
        )
    if kind == "wait":
        on_reply = draw(_or_next(index, count) if stop_on_reply else _targets(index, count))
        return WaitForReplyStep(
            id=own,
            timeout_seconds=draw(st.sampled_from(TIMEOUTS)),
            on_reply=on_reply,
            on_timeout=draw(_or_next(index, count)),
        )
    variants = draw(st.integers(1, 3))
    holdout = draw(st.integers(1 if variants == 1 else 0, 3))
    names = [f"v{v}" for v in range(variants)]
    return SplitStep(
        id=own,
        delay_seconds=draw(st.sampled_from(DELAYS)),
        experiment=f"e{index}",
        variants=[
            Variant(name=name, weight=draw(st.integers(1, 5)), to=draw(_targets(index, count)))
            for name in names
        ],
        holdout_weight=holdout,
        winner=draw(st.one_of(st.none(), st.none(), st.none(), st.sampled_from(names))),
    )


@st.composite
def definitions(draw: st.DrawFn, max_steps: int = 7) -> Definition:
    """A publishable definition: message, branch, wait and split steps, each with an id, going forward
    (next in the list, a later id, or ``end``), ending and rejoining as drawn; stop on reply on or off
    (off: every wait names its reply path)."""
    count = draw(st.integers(1, max_steps))
    stop_on_reply = draw(st.booleans())
    steps = [draw(_node(index, count, stop_on_reply)) for index in range(count)]
    return Definition(steps=steps, stop_on=StopFlags(reply=stop_on_reply))


@st.composite
def histories(draw: st.DrawFn, steps: int) -> History:
    """A contact's tags, and at each step whether it replies (at a wait) or reads the message (at a
    message step)."""
    flags = st.lists(st.booleans(), min_size=steps, max_size=steps).map(tuple)
    tags = frozenset(draw(st.sets(st.sampled_from(TAGS))))
    chosen = st.lists(
        st.sampled_from([None, None, None, None, "v0", "v1", "v2", "gone"]), min_size=steps, max_size=steps
    )
    return History(tags, draw(flags), draw(flags), draw(flags), draw(st.booleans()), tuple(draw(chosen)))
