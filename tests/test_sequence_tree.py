"""The builder's tree of a sequence's steps (services.api.dashboard.sequence_tree), derived from the flat
list: a straight line, a branch whose paths rejoin, nested branches, a wait's reply and timeout paths, a
split with a holdout, paths that end or jump, and a draft's steps no path reaches or targets no step has."""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common.followups.definition import Definition
from services.api.dashboard.sequence_tree import Lane, LaneEnd, Section, TreeStep, tree


def msg(id: str | None = None, next: str | None = None) -> dict[str, Any]:
    return {"kind": "message", "text": "hi", "id": id, "next": next}


def definition(*steps: dict[str, Any]) -> Definition:
    return msgspec.convert({"steps": list(steps)}, Definition)


def end_of(end: LaneEnd) -> str:
    return end.kind if end.step is None else f"{end.kind} {end.step}"


def shape(items: list[TreeStep]) -> list[Any]:
    """Steps as their indexes; a control step as (index, {lane: (steps, end)}, join)."""
    out: list[Any] = []
    for item in items:
        if not item.lanes:
            out.append(item.index)
            continue
        lanes = {_lane_key(lane): (shape(lane.items), end_of(lane.end)) for lane in item.lanes}
        out.append((item.index, lanes, item.join))
    return out


def _lane_key(lane: Lane) -> str:
    return lane.kind if lane.name is None else f"{lane.kind}:{lane.name}"


def section(s: Section) -> tuple[list[Any], str]:
    return shape(s.items), end_of(s.end)


def test_a_straight_line_is_one_section_that_ends() -> None:
    built = tree(definition(msg(), msg(), msg()))
    assert section(built.main) == ([0, 1, 2], "end")
    assert built.detached == []


def test_no_steps_is_an_empty_tree() -> None:
    built = tree(definition())
    assert section(built.main) == ([], "end") and built.detached == []


def test_a_branchs_paths_nest_their_steps_and_rejoin() -> None:
    built = tree(
        definition(
            msg(),
            {
                "kind": "branch",
                "paths": [
                    {"name": "vip", "when": {"all": []}, "to": "vip"},
                    {"name": "unread", "read": False, "to": "nudge"},
                ],
            },
            msg(next="after"),  # otherwise: the next step, then the rejoin
            msg(id="vip"),
            msg(next="after"),
            msg(id="nudge"),
            msg(id="after"),
        )
    )
    assert section(built.main) == (
        [
            0,
            (
                1,
                {
                    "path:vip": ([3, 4], "rejoin 6"),
                    "path:unread": ([5], "rejoin 6"),
                    "otherwise": ([2], "rejoin 6"),
                },
                6,
            ),
            6,
        ],
        "end",
    )
    (branch,) = [item for item in built.main.items if item.lanes]
    assert [(lane.field, lane.read) for lane in branch.lanes] == [
        ("paths.0.to", None),
        ("paths.1.to", False),
        ("otherwise", None),
    ]
    assert branch.lanes[0].when == {"all": []}


def test_nested_branches_rejoin_where_their_paths_meet() -> None:
    built = tree(
        definition(
            {"kind": "branch", "paths": [{"name": "a", "to": "a"}], "otherwise": "b"},
            {"id": "a", "kind": "branch", "paths": [{"name": "a1", "to": "a1"}], "otherwise": "a2"},
            msg(id="a1", next="b"),
            msg(id="a2", next="b"),
            msg(id="b"),
        )
    )
    assert section(built.main) == (
        [
            (
                0,
                {
                    "path:a": (
                        [(1, {"path:a1": ([2], "rejoin 4"), "otherwise": ([3], "rejoin 4")}, 4)],
                        "rejoin 4",
                    ),
                    "otherwise": ([], "rejoin 4"),
                },
                4,
            ),
            4,
        ],
        "end",
    )


def test_a_nested_path_that_ends_leaves_its_branch_without_a_join() -> None:
    built = tree(
        definition(
            {"kind": "branch", "paths": [{"name": "a", "to": "a"}], "otherwise": "b"},
            {"id": "a", "kind": "branch", "paths": [{"name": "a1", "to": "a1"}], "otherwise": "a2"},
            msg(id="a1", next="b"),
            msg(id="a2", next="end"),
            msg(id="b"),
        )
    )
    inner = (1, {"path:a1": ([2], "rejoin 4"), "otherwise": ([3], "end")}, None)
    assert section(built.main) == (
        [(0, {"path:a": ([inner], "paths"), "otherwise": ([], "rejoin 4")}, 4), 4],
        "end",
    )


def test_paths_that_all_end_end_the_section_in_them() -> None:
    built = tree(
        definition(
            {"kind": "branch", "paths": [{"name": "a", "to": "end"}], "otherwise": "end"},
            msg(),  # no path reaches it
        )
    )
    assert section(built.main) == ([(0, {"path:a": ([], "end"), "otherwise": ([], "end")}, None)], "paths")
    (unreached,) = built.detached
    assert section(unreached) == ([1], "end") and unreached.reached_from == []


def test_one_continuing_path_beside_one_that_ends_nests_its_steps() -> None:
    built = tree(
        definition({"kind": "branch", "paths": [{"name": "a", "to": "a"}], "otherwise": "end"}, msg(id="a"))
    )
    assert section(built.main) == ([(0, {"path:a": ([1], "end"), "otherwise": ([], "end")}, None)], "paths")


def test_a_wait_has_its_reply_and_timeout_paths() -> None:
    stops = tree(definition(msg(), {"kind": "wait_for_reply", "timeout_seconds": 86400}, msg()))
    assert section(stops.main) == (
        [0, (1, {"reply": ([], "stop"), "timeout": ([], "rejoin 2")}, 2), 2],
        "end",
    )
    replied = tree(
        definition(
            msg(),
            {"kind": "wait_for_reply", "timeout_seconds": 60, "on_reply": "thanks", "on_timeout": "nudge"},
            msg(id="nudge", next="end"),
            msg(id="thanks"),
        )
    )
    assert section(replied.main) == (
        [0, (1, {"reply": ([3], "end"), "timeout": ([2], "end")}, None)],
        "paths",
    )


def test_a_split_shows_its_variants_shares_and_holdout() -> None:
    built = tree(
        definition(
            {
                "kind": "split",
                "experiment": "tone",
                "variants": [{"name": "warm", "weight": 2, "to": "warm"}, {"name": "short", "to": "short"}],
                "holdout_weight": 1,
                "winner": "short",
            },
            msg(id="warm", next="last"),
            msg(id="short"),
            msg(id="last"),
        )
    )
    assert section(built.main) == (
        [
            (
                0,
                {
                    "variant:warm": ([1], "rejoin 3"),
                    "variant:short": ([2], "rejoin 3"),
                    "holdout:holdout": ([], "end"),
                },
                3,
            ),
            3,
        ],
        "end",
    )
    lanes = built.main.items[0].lanes
    assert [(lane.weight, lane.share, lane.winner) for lane in lanes] == [
        (2, 50.0, False),
        (1, 25.0, True),
        (1, 25.0, False),
    ]
    assert [lane.field for lane in lanes] == ["variants.0.to", "variants.1.to", None]


def test_a_jump_past_the_join_goes_to_a_step_drawn_after() -> None:
    built = tree(
        definition(
            {"kind": "branch", "paths": [{"name": "a", "to": "a"}], "otherwise": "b"},
            {"id": "a", "kind": "branch", "paths": [{"name": "far", "to": "far"}], "otherwise": "b"},
            msg(id="b", next="end"),
            msg(id="far"),
        )
    )
    # the outer paths rejoin at b; the inner path "far" jumps past it, to a step b does not go to
    inner: Any = (1, {"path:far": ([], "goto 3"), "otherwise": ([], "rejoin 2")}, None)
    assert section(built.main) == (
        [(0, {"path:a": ([inner], "paths"), "otherwise": ([], "rejoin 2")}, 2), 2],
        "end",
    )
    (far,) = built.detached
    assert section(far) == ([3], "end") and far.reached_from == [1]


def test_a_step_two_paths_reach_is_drawn_once() -> None:
    built = tree(
        definition(
            {
                "kind": "split",
                "experiment": "e",
                "variants": [{"name": "a", "to": "a"}, {"name": "b", "to": "b"}],
            },
            msg(id="a", next="c"),
            msg(id="b", next="c"),
            msg(id="c"),
        )
    )
    assert section(built.main) == (
        [(0, {"variant:a": ([1], "rejoin 3"), "variant:b": ([2], "rejoin 3")}, 3), 3],
        "end",
    )


def test_a_drafts_missing_target_and_an_unreached_step_are_still_drawn() -> None:
    built = tree(
        definition(
            msg(next="nowhere"),
            msg(id="lost"),
            {"kind": "branch", "paths": [{"name": "p", "to": "lost"}]},  # backward: no later step has it
            msg(),
        )
    )
    assert section(built.main) == ([0], "missing")
    (first,) = built.detached
    assert section(first) == ([1, (2, {"path:p": ([], "missing"), "otherwise": ([3], "end")}, None)], "paths")
    assert first.reached_from == []
