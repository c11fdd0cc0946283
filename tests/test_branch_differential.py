"""Where an enrollment goes through a sequence's graph, held to a plain-Python model
(:mod:`tests.branch_helpers`) over generated graphs and histories.

Each example draws a publishable definition (message, branch, wait-for-reply and split steps, going
forward by ``next``, paths, reply and timeout paths and variants, ending and rejoining) and a contact's
history (its tags, which the branches' conditions read; whether it replies at each wait before the
timeout; whether it reads each message before the next step is taken). The model predicts the step runs
(index, outcome, reason) and how the enrollment finishes; the product must agree:

- walking the graph with graph.py's functions (``following``, ``branch_target``, ``path_holds``,
  ``wait_target``, ``reply_step``, ``assign``), many examples;
- releasing it for real on PostgreSQL, fewer examples: see below.
"""

from __future__ import annotations

import uuid

from hypothesis import example, given, settings
from hypothesis import strategies as st

from libs.common.followups import graph
from libs.common.followups.definition import (
    BranchPath,
    BranchStep,
    Definition,
    MessageStep,
    SplitStep,
    StopFlags,
    Variant,
    WaitForReplyStep,
    validate_definition,
)
from tests.branch_helpers import History, Run, Walk, definitions, histories, holds, model, split_arm
from tests.condition_helpers import QUICK

# --- the product's graph functions, walking the same graph --------------------------------------------


def walk(definition: Definition, history: History, sequence_id: uuid.UUID, contact_id: uuid.UUID) -> Walk:
    """Where graph.py sends the enrollment, step after step, for the history."""
    runs: list[Run] = []
    last_status: str | None = None  # the last queued message's status
    index = 0
    while index != graph.END:
        node = definition.steps[index]
        if isinstance(node, MessageStep):
            runs.append((index, "queued", None))
            last_status = "READ" if history.reads[index] else "QUEUED"
            index = graph.following(definition, index)
        elif isinstance(node, BranchStep):
            held = [graph.path_holds(p.read, holds(p.when, history.tags), last_status) for p in node.paths]
            name, index_after = graph.branch_target(definition, index, held)
            runs.append((index, "branched", f"path:{name}" if name is not None else "otherwise"))
            index = index_after
        elif isinstance(node, WaitForReplyStep):
            outcome: graph.WaitOutcome = "replied" if history.replies[index] else "no_reply"
            target = graph.wait_target(definition, index, outcome)
            # what the enrollment keeps while it waits is where the reply path goes
            assert graph.reply_step(definition, index) == graph.wait_target(definition, index, "replied")
            if target is None:
                return Walk(tuple(runs), "stopped", "replied")
            runs.append((index, "branched", outcome))
            index = target
        else:
            assert isinstance(node, SplitStep)
            assert graph.is_control(node)
            arm = graph.assign(definition, index, sequence_id, contact_id)
            assert arm.experiment == node.experiment
            if arm.variant == graph.HOLDOUT:
                assert arm.target == graph.END
                runs.append((index, "branched", "holdout"))
            else:
                runs.append((index, "branched", f"variant:{arm.variant}"))
            index = arm.target
    return Walk(tuple(runs), "completed", None)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Definition, History, uuid.UUID, uuid.UUID]:
    definition = draw(definitions())
    history = draw(histories(len(definition.steps)))
    return definition, history, draw(st.uuids()), draw(st.uuids())


# Examples spelled out: a reply taken and then a wait without one; a read message down the read path; a
# split's winner; a holdout.
SEQUENCE, CONTACT = uuid.UUID(int=1), uuid.UUID(int=2)
REPLY_THEN_WAIT = Definition(
    steps=[
        MessageStep(id="a", text="a"),
        WaitForReplyStep(id="w1", timeout_seconds=3600, on_reply="b", on_timeout="end"),
        MessageStep(id="b", text="b"),
        WaitForReplyStep(id="w2", timeout_seconds=3600, on_reply="end"),
        MessageStep(id="c", text="c"),
    ]
)
READ_PATH = Definition(
    steps=[
        MessageStep(id="a", text="a"),
        BranchStep(
            id="br",
            paths=[
                BranchPath(
                    name="vip",
                    when={"attribute": "contact.tags", "operator": "contains", "value": "t1"},
                    read=False,
                    to="end",
                ),
                BranchPath(name="read", read=True, to="c"),
            ],
        ),
        MessageStep(id="b", text="b", next="end"),
        MessageStep(id="c", text="c"),
    ],
    stop_on=StopFlags(reply=False),
)


def _split(winner: str | None, holdout: int) -> Definition:
    return Definition(
        steps=[
            SplitStep(
                id="sp",
                experiment="e",
                variants=[Variant(name="x", weight=1, to="x"), Variant(name="y", weight=1, to="end")],
                holdout_weight=holdout,
                winner=winner,
            ),
            MessageStep(id="x", text="x"),
        ]
    )


def _history(
    steps: int, tags: tuple[str, ...] = (), replies: tuple[int, ...] = (), reads: tuple[int, ...] = ()
) -> History:
    return History(
        frozenset(tags), tuple(i in replies for i in range(steps)), tuple(i in reads for i in range(steps))
    )


def test_the_model_reads_the_examples_as_documented() -> None:
    """The model itself, on examples worked by hand (so that an agreement of two wrong walks shows)."""
    assert model(REPLY_THEN_WAIT, _history(5, replies=(1,)), SEQUENCE, CONTACT) == Walk(
        (
            (0, "queued", None),
            (1, "branched", "replied"),
            (2, "queued", None),
            (3, "branched", "no_reply"),
            (4, "queued", None),
        ),
        "completed",
        None,
    )
    assert model(REPLY_THEN_WAIT, _history(5, replies=(1, 3)), SEQUENCE, CONTACT).runs[-1] == (
        3,
        "branched",
        "replied",
    )
    assert model(REPLY_THEN_WAIT, _history(5), SEQUENCE, CONTACT) == Walk(
        ((0, "queued", None), (1, "branched", "no_reply")), "completed", None
    )
    # the vip path wants the message unread: read, the read path holds; unread and not vip, otherwise
    assert model(READ_PATH, _history(4, tags=("t1",), reads=(0,)), SEQUENCE, CONTACT).runs == (
        (0, "queued", None),
        (1, "branched", "path:read"),
        (3, "queued", None),
    )
    assert model(READ_PATH, _history(4, tags=("t1",)), SEQUENCE, CONTACT).runs == (
        (0, "queued", None),
        (1, "branched", "path:vip"),
    )
    assert model(READ_PATH, _history(4), SEQUENCE, CONTACT).runs == (
        (0, "queued", None),
        (1, "branched", "otherwise"),
        (2, "queued", None),
    )
    assert model(_split("y", 5), _history(2), SEQUENCE, CONTACT).runs == ((0, "branched", "variant:y"),)
    # a contact held out: find one, then the split without a holdout sends it to a variant
    split = _split(None, 8).steps[0]
    assert isinstance(split, SplitStep)
    held = next(c for c in (uuid.UUID(int=n) for n in range(100)) if split_arm(split, SEQUENCE, c) is None)
    assert model(_split(None, 8), _history(2), SEQUENCE, held) == Walk(
        ((0, "branched", "holdout"),), "completed", None
    )
    assert model(_split(None, 0), _history(2), SEQUENCE, held).runs[0][2] in ("variant:x", "variant:y")


@settings(QUICK, max_examples=600)
@given(case=cases())
@example(case=(REPLY_THEN_WAIT, _history(5, replies=(1,)), SEQUENCE, CONTACT))
@example(case=(READ_PATH, _history(4, tags=("t1",), reads=(0,)), SEQUENCE, CONTACT))
@example(case=(_split("y", 5), _history(2), SEQUENCE, CONTACT))
def test_graph_walks_the_generated_graphs_as_the_model(
    case: tuple[Definition, History, uuid.UUID, uuid.UUID],
) -> None:
    definition, history, sequence_id, contact_id = case
    validate_definition(definition)  # every generated graph is publishable
    assert walk(definition, history, sequence_id, contact_id) == model(
        definition, history, sequence_id, contact_id
    )
