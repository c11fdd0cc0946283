"""Where an enrollment goes through a sequence's graph, held to a plain-Python model
(:mod:`tests.branch_helpers`) over generated graphs and histories.

Each example draws a publishable definition (message, AI, branch, wait-for-reply and split steps, going
forward by ``next``, paths, reply and timeout paths and variants, ending and rejoining; stop on reply on or
off) and a contact's history: its tags, which the branches' conditions read (had at enrollment, or given
just after it); whether it replies at each wait before the timeout; whether it reads each message, and
writes in after it, before the next step is taken; the winner chosen for each split's experiment, if any.
The model predicts the step runs (index, outcome, reason) and how the enrollment finishes; the product
must agree:

- walking the graph with graph.py's functions (``following``, ``branch_target``, ``path_holds``,
  ``wait_target``, ``reply_step``, ``assign``), many examples;
- releasing it for real on PostgreSQL, fewer examples (:func:`release_for_real`: the release on the
  controllable clock, the replies and the read receipts through the ingress), the assignments recorded on
  the enrollment too.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import msgspec
import pytest
from hypothesis import Phase, example, given, note, settings
from hypothesis import strategies as st
from psycopg_pool import ConnectionPool

from libs.common.contracts.platform_events import InboundMessage, MessageStatus
from libs.common.core import effects
from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups import graph
from libs.common.followups.definition import (
    AiStep,
    BranchPath,
    BranchStep,
    Definition,
    MessageStep,
    SkipFallback,
    SplitStep,
    StopFlags,
    Variant,
    WaitForReplyStep,
    validate_definition,
)
from libs.common.followups.enrollments import stop_enrollment
from libs.common.followups.release import release_one
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.ingress import contact_changes, handle_event
from libs.common.platform.projects import create_project
from tests.branch_helpers import (
    FALLBACK,
    TAGS,
    History,
    Run,
    Walk,
    definitions,
    histories,
    holds,
    model,
    split_arm,
)
from tests.condition_helpers import POOL_THREADS_USE_RANDOM, QUICK
from tests.factories import make_contact, make_enrollment
from tests.helpers import rows
from tests.release_helpers import SETTINGS, state, step_runs

# --- the product's graph functions, walking the same graph --------------------------------------------


def walk(definition: Definition, history: History, sequence_id: uuid.UUID, contact_id: uuid.UUID) -> Walk:
    """Where graph.py sends the enrollment, step after step, for the history."""
    runs: list[Run] = []
    last_status: str | None = None  # the last queued message's status
    index = 0
    while index != graph.END:
        node = definition.steps[index]
        if isinstance(node, MessageStep | AiStep):
            step = graph.sending_step(definition, index)
            queued = not (isinstance(step, AiStep) and isinstance(step.fallback, SkipFallback))
            if queued:
                runs.append((index, "queued", None if isinstance(step, MessageStep) else FALLBACK))
                last_status = "READ" if history.reads[index] else "QUEUED"
            else:
                runs.append((index, "skipped", "ai_unavailable"))
            writes, index = history.writes[index] and queued, graph.following(definition, index)
            # writing in while not at a wait: the stop path's (stop on reply), not the graph's
            at_wait = index != graph.END and isinstance(definition.steps[index], WaitForReplyStep)
            if writes and index != graph.END and not at_wait and definition.stop_on.reply:
                return Walk(tuple(runs), "stopped", "replied")
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
            arm = graph.assign(definition, index, sequence_id, contact_id, history.chosen[index])
            assert arm.experiment == node.experiment
            if arm.variant == graph.HOLDOUT:
                assert arm.target == graph.END
                runs.append((index, "branched", "holdout"))
            else:
                runs.append((index, "branched", f"variant:{arm.variant}"))
            index = arm.target
    return Walk(tuple(runs), "completed", None)


@st.composite
def cases(draw: st.DrawFn, max_steps: int = 7) -> tuple[Definition, History]:
    """A definition and a contact's history through it."""
    definition = draw(definitions(max_steps))
    return definition, draw(histories(len(definition.steps)))


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
WAIT_TO_WAIT = Definition(
    steps=[
        MessageStep(id="a", text="a"),
        WaitForReplyStep(id="w1", timeout_seconds=3600, on_reply="w2", on_timeout="end"),
        WaitForReplyStep(id="w2", timeout_seconds=3600, on_reply="c", on_timeout="end"),
        MessageStep(id="c", text="c"),
    ]
)
#: The contact writes in between two messages, then does not reply at the wait (stop on reply off).
WRITES_BEFORE_WAIT = Definition(
    steps=[
        MessageStep(id="a", text="a"),
        MessageStep(id="b", text="b", delay_seconds=3600),
        WaitForReplyStep(id="w", timeout_seconds=3600, on_reply="end"),
        MessageStep(id="c", text="c"),
    ],
    stop_on=StopFlags(reply=False),
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
    steps: int,
    tags: tuple[str, ...] = (),
    replies: tuple[int, ...] = (),
    reads: tuple[int, ...] = (),
    writes: tuple[int, ...] = (),
) -> History:
    replied, read, wrote = (tuple(i in chosen for i in range(steps)) for chosen in (replies, reads, writes))
    return History(frozenset(tags), replied, read, wrote, chosen=(None,) * steps)


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
    # writing in before the wait is no reply at the wait; with stop on reply, it stops the enrollment
    assert model(WRITES_BEFORE_WAIT, _history(4, writes=(0,)), SEQUENCE, CONTACT) == Walk(
        ((0, "queued", None), (1, "queued", None), (2, "branched", "no_reply"), (3, "queued", None)),
        "completed",
        None,
    )
    stopping = msgspec.structs.replace(WRITES_BEFORE_WAIT, stop_on=StopFlags())
    assert model(stopping, _history(4, writes=(0,)), SEQUENCE, CONTACT) == Walk(
        ((0, "queued", None),), "stopped", "replied"
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
@given(case=cases(), sequence_id=st.uuids(), contact_id=st.uuids())
@example(case=(REPLY_THEN_WAIT, _history(5, replies=(1,))), sequence_id=SEQUENCE, contact_id=CONTACT)
@example(case=(READ_PATH, _history(4, tags=("t1",), reads=(0,))), sequence_id=SEQUENCE, contact_id=CONTACT)
@example(case=(_split("y", 5), _history(2)), sequence_id=SEQUENCE, contact_id=CONTACT)
def test_graph_walks_the_generated_graphs_as_the_model(
    case: tuple[Definition, History], sequence_id: uuid.UUID, contact_id: uuid.UUID
) -> None:
    definition, history = case
    validate_definition(definition)  # every generated graph is publishable
    assert walk(definition, history, sequence_id, contact_id) == model(
        definition, history, sequence_id, contact_id
    )


# --- the real release on PostgreSQL ----------------------------------------------------------------------


def publish(pool: ConnectionPool, project_id: uuid.UUID, definition: Definition) -> uuid.UUID:
    with pool.connection() as conn:
        created = create_sequence(
            conn, project_id, SequenceCreate(name=f"graph {uuid.uuid4().hex[:6]}", definition=definition)
        )
        publish_sequence(conn, project_id, created.id)
    return created.id


def reply(runtime: Runtime, project_id: uuid.UUID, contact_id: uuid.UUID) -> None:
    """The contact writes in, through the real inbound-message path (its stop path, or the reply path)."""
    event = InboundMessage(contact_id=contact_id, provider_message_id=f"reply-{uuid.uuid4()}", body="yes")
    handle_event(runtime, project_id, event, now=runtime.clock.now())


def read(runtime: Runtime, project_id: uuid.UUID, message_id: uuid.UUID) -> None:
    """The provider reports the message read."""
    event = MessageStatus(message_id=message_id, status="READ")
    handle_event(runtime, project_id, event, now=runtime.clock.now())


def choose_winners(
    pool: ConnectionPool,
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    definition: Definition,
    history: History,
) -> None:
    """The winners the history chose for the splits' experiments, recorded as choosing one records them
    (after publishing, which recorded the splits' own winners: a later choice replaces them)."""
    for node, chosen in zip(definition.steps, history.chosen, strict=True):
        if isinstance(node, SplitStep) and chosen is not None:
            with pool.connection() as conn:
                conn.execute(
                    "INSERT INTO followup_experiment_winners"
                    " (project_id, sequence_id, experiment, variant, version_id, chosen_at)"
                    " SELECT project_id, id, %s, %s, current_version_id, now() FROM followup_sequences"
                    " WHERE project_id = %s AND id = %s ON CONFLICT (project_id, sequence_id, experiment)"
                    " DO UPDATE SET variant = excluded.variant, chosen_at = excluded.chosen_at",
                    (node.experiment, chosen, project_id, sequence_id),
                )


def release_for_real(
    runtime: Runtime, clock: ManualClock, definition: Definition, history: History
) -> tuple[Walk, uuid.UUID, uuid.UUID]:
    """Publish the definition in a project of its own, enroll a contact with the history's tags (or,
    ``late``, with the others, changed to the history's once enrolled), and release it step after step on
    the clock (set to each due time): the contact reads each message the history says it reads at once,
    writes in a minute after each message the history says it writes after (unless the enrollment then
    waits for a reply), and replies a minute into each wait the history says it replies at. Returns the
    step runs and how the enrollment finished, the sequence's and the contact's ids."""
    pool = runtime.pool
    with pool.connection() as conn:
        project_id = create_project(conn, f"branches {uuid.uuid4().hex[:6]}").project_id
    sequence_id = publish(pool, project_id, definition)
    choose_winners(pool, project_id, sequence_id, definition, history)
    other = sorted(set(TAGS) - history.tags)
    contact_id = make_contact(pool, project_id, tags=other if history.late else sorted(history.tags))
    enrollment = make_enrollment(pool, clock, project_id, sequence_id, contact_id)
    if history.late:  # the contact's tags change once enrolled, through the tags' own path
        with effects.transaction(runtime) as conn:
            add, now = sorted(history.tags), clock.now()
            contact_changes.change_tags(conn, project_id, contact_id, add=add, remove=other, now=now)
    waited: set[int] = set()  # the waits replied at
    try:
        for _ in range(4 * len(definition.steps) + 4):
            status, _, index, due = state(pool, enrollment.id)
            if status != "active":
                break
            node = definition.steps[index]
            if isinstance(node, WaitForReplyStep) and history.replies[index] and index not in waited:
                waited.add(index)
                clock.advance(timedelta(minutes=1))
                reply(runtime, project_id, contact_id)
                if node.on_reply is not None:  # a reply takes the reply path at once, not at the timeout
                    moved = state(pool, enrollment.id)
                    assert moved[0] != "active" or moved[2] != index, ("the reply left it waiting", index)
                continue
            clock.set(max(clock.now(), due))
            released = release_one(pool, clock, SETTINGS, project_id=project_id)
            assert released is not None, ("nothing was due", index, due)
            assert released.action not in ("retry", "fail"), released
            if released.action == "defer":  # the contact's spacing after a message: the same step later
                assert released.reason == "recipient_gap", released
                continue
            queued = released.action == "queue"
            if queued and history.reads[index]:
                assert released.message_id is not None, released
                read(runtime, project_id, released.message_id)
            if queued and history.writes[index]:
                status, _, moved_to, _ = state(pool, enrollment.id)
                if status == "active" and not isinstance(definition.steps[moved_to], WaitForReplyStep):
                    clock.advance(timedelta(minutes=1))
                    reply(runtime, project_id, contact_id)
        else:
            raise AssertionError("the enrollment did not finish")
        status, reason, _, _ = state(pool, enrollment.id)
        return Walk(tuple(step_runs(pool, enrollment.id)), status, reason), sequence_id, contact_id
    finally:
        if state(pool, enrollment.id)[0] in ("active", "paused"):  # a failed example leaves nothing due
            with pool.connection() as conn:
                stop_enrollment(conn, project_id, enrollment.id, note=None, now=clock.now())


def assignments(definition: Definition, walk: Walk) -> dict[str, str]:
    """The arms the walk's splits recorded, by experiment (as the enrollment keeps them)."""
    found = {}
    for index, _, reason in walk.runs:
        node = definition.steps[index]
        if isinstance(node, SplitStep):
            assert reason is not None
            found[node.experiment] = reason.removeprefix("variant:")
    return found


def recorded_assignments(runtime: Runtime, sequence_id: uuid.UUID) -> dict[str, str]:
    found = rows(
        runtime.pool, "SELECT assignments FROM followup_enrollments WHERE sequence_id = %s", sequence_id
    )
    assert len(found) == 1
    return found[0][0] or {}


@pytest.mark.timeout(900)
@POOL_THREADS_USE_RANDOM
@settings(QUICK, max_examples=120, phases=[Phase.explicit, Phase.generate])
@given(case=cases(max_steps=6))
@example(case=(REPLY_THEN_WAIT, _history(5, replies=(1,)))).via("a reply taken, then a wait without one")
@example(case=(WAIT_TO_WAIT, _history(4, replies=(1, 2)))).via("a reply path into another wait")
@example(case=(READ_PATH, _history(4, tags=("t1",), reads=(0,)))).via("a read message down the read path")
@example(case=(READ_PATH, _history(4, tags=("t1",)))).via("a tag's path")
@example(case=(WRITES_BEFORE_WAIT, _history(4, writes=(0,)))).via("writing in is no reply at a later wait")
@example(case=(_split("y", 5), _history(2))).via("a split's winner")
@example(case=(_split(None, 50), _history(2))).via("a split held out (most likely)")
def test_the_release_walks_the_generated_graphs_as_the_model(
    runtime: Runtime, clock: ManualClock, case: tuple[Definition, History]
) -> None:
    definition, history = case
    note(f"definition: {msgspec.json.encode(definition).decode()}")
    note(f"history: {history}")
    found, sequence_id, contact_id = release_for_real(runtime, clock, definition, history)
    expected = model(definition, history, sequence_id, contact_id)
    assert found == expected
    assert recorded_assignments(runtime, sequence_id) == assignments(definition, expected)


@pytest.mark.parametrize("stop_on_reply", [True, False])
def test_a_reply_path_into_another_wait_takes_that_waits_reply_path_too(
    runtime: Runtime, clock: ManualClock, stop_on_reply: bool
) -> None:
    """A reply at the first wait moves the enrollment to a second wait (its reply path); a second reply
    takes the second wait's reply path at once: neither stopped (stop on reply) nor left waiting for the
    timeout (stop on reply off)."""
    definition = msgspec.structs.replace(WAIT_TO_WAIT, stop_on=StopFlags(reply=stop_on_reply))
    found, _, _ = release_for_real(runtime, clock, definition, _history(4, replies=(1, 2)))
    assert found == Walk(
        ((0, "queued", None), (1, "branched", "replied"), (2, "branched", "replied"), (3, "queued", None)),
        "completed",
        None,
    )


@pytest.mark.parametrize("stop_on_reply", [True, False])
def test_a_reply_after_the_deadline_before_the_late_release_still_takes_the_reply_path(
    runtime: Runtime, clock: ManualClock, stop_on_reply: bool
) -> None:
    """A wait of an hour, released late (a backlog, an outage): the contact replies five minutes after the
    deadline, before the timeout is released. As docs/api.md says, the reply path is taken (the no-reply
    path's follow-up never goes to a contact who replied), whatever the release's lag."""
    definition = Definition(
        steps=[
            MessageStep(id="a", text="a"),
            WaitForReplyStep(id="w", timeout_seconds=3600, on_reply="replied", on_timeout="timed-out"),
            MessageStep(id="timed-out", text="no reply", next="end"),
            MessageStep(id="replied", text="thanks"),
        ],
        stop_on=StopFlags(reply=stop_on_reply),
    )
    pool = runtime.pool
    with pool.connection() as conn:
        project_id = create_project(conn, "late release").project_id
    contact_id = make_contact(pool, project_id)
    enrollment = make_enrollment(pool, clock, project_id, publish(pool, project_id, definition), contact_id)
    assert release_one(pool, clock, SETTINGS, project_id=project_id) is not None
    deadline = state(pool, enrollment.id)[3]

    clock.set(deadline + timedelta(minutes=5))
    reply(runtime, project_id, contact_id)
    while release_one(pool, clock, SETTINGS, project_id=project_id) is not None:
        pass

    assert step_runs(pool, enrollment.id) == [
        (0, "queued", None),
        (1, "branched", "replied"),
        (3, "queued", None),
    ]
    assert state(pool, enrollment.id)[:2] == ("completed", None)
