"""The preview follows the contact down its path: a branch's path (its conditions over the contact), a
split's variant (the contact's own, as the release assigns it), a wait for a reply's timeout path, or with
``assume_reply`` its reply path (or the stop a reply is); the steps off the path are ``not_reached``; and
the same contact enrolled for real and released on the clock takes exactly that path."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from litestar.testing import TestClient

from libs.common.core.runtime import Runtime
from services.release.release import release_one
from tests.test_sequence_branches import inbound
from tests.test_sequence_preview import (
    FRIDAY_EVENING,
    SETTINGS,
    manual,
    new_contact,
    new_sequence,
    ok,
    previewed,
    released_for_real,
    table_counts,
)

ACTIONS = {"queued": "queue", "skipped": "skip", "branched": "branch", "paused": "pause", "stopped": "stop"}


def taken(answer: dict[str, Any]) -> list[tuple[int, str, str | None]]:
    """The steps the preview says the contact takes, in order: (step, outcome, stored reason)."""
    out = []
    for step in answer["steps"]:
        reason = step["reason"]
        if reason is not None and step["reason_detail"] is not None:
            reason = f"{reason}:{step['reason_detail']}"
        out.append((step["step_index"], step["outcome"], reason))
    return out


def as_released(answer: dict[str, Any]) -> list[tuple[int, str, str | None, datetime]]:
    """The preview as the releases it predicts: (step, action, stored reason, when), deferrals included."""
    out = []
    for step in answer["steps"]:
        for deferral in step["deferrals"]:
            at = datetime.fromisoformat(deferral["at"].replace("Z", "+00:00"))
            out.append((step["step_index"], "defer", deferral["reason"], at))
        if step["outcome"] in ACTIONS:
            reason = step["reason"]
            if reason is not None and step["reason_detail"] is not None:
                reason = f"{reason}:{step['reason_detail']}"
            at = datetime.fromisoformat(step["at"].replace("Z", "+00:00"))
            out.append((step["step_index"], ACTIONS[step["outcome"]], reason, at))
    return out


BRANCH_AND_SPLIT = (
    {"kind": "message", "text": "Hi {{contact.name}}"},
    {
        "kind": "branch",
        "delay_seconds": 3600,
        "paths": [
            {
                "name": "ada",
                "when": {"all": [{"attribute": "contact.name", "operator": "equal_to", "value": "Ada"}]},
                "to": "vip",
            }
        ],
        "otherwise": "plain",
    },
    {"kind": "message", "id": "plain", "text": "Plain", "next": "exp"},
    {"kind": "message", "id": "vip", "text": "VIP"},
    {
        "kind": "split",
        "id": "exp",
        "experiment": "tone",
        "variants": [{"name": "warm", "to": "warm"}, {"name": "short", "to": "short"}],
    },
    {"kind": "message", "id": "warm", "text": "Warm", "next": "end"},
    {"kind": "message", "id": "short", "text": "Short"},
)


def test_the_preview_follows_a_branch_and_a_split_as_the_release_then_does(
    client: TestClient[Any], runtime: Runtime
) -> None:
    manual(runtime).set(FRIDAY_EVENING)
    sequence = new_sequence(client, *BRANCH_AND_SPLIT)
    ada, bob = new_contact(client, name="Ada"), new_contact(client, name="Bob")
    before = table_counts(runtime)

    answer = previewed(client, sequence, contact_id=ada)
    other = previewed(client, sequence, contact_id=bob)

    assert table_counts(runtime) == before  # nothing kept: no assignment, no step run
    steps = taken(answer)
    # Ada takes the branch's path "ada", then her variant; the other path and variant are not reached
    assert steps[:4] == [
        (0, "queued", None),
        (1, "branched", "path:ada"),
        (3, "queued", None),
        (4, "branched", steps[3][2]),
    ]
    variant = steps[3][2]
    assert variant in ("variant:warm", "variant:short")
    chosen = 5 if variant == "variant:warm" else 6
    assert steps[4:] == [(chosen, "queued", None), *[(i, "not_reached", None) for i in (2, 11 - chosen)]]
    assert answer["steps"][1]["kind"] == "branch" and answer["steps"][3]["kind"] == "split"
    # Bob's name is not Ada: otherwise, then the plain step goes on to the split
    assert [s[:3] for s in taken(other)[:4]] == [
        (0, "queued", None),
        (1, "branched", "otherwise"),
        (2, "queued", None),
        (4, "branched", taken(other)[3][2]),
    ]

    enrollment = ok(client.post("/v1/enrollments", json={"sequence_id": sequence, "contact_id": ada}), 201)[
        "id"
    ]
    assert released_for_real(runtime, enrollment) == as_released(answer)


WAIT = (
    {"kind": "message", "text": "Hi"},
    {"kind": "wait_for_reply", "timeout_seconds": 86400, "on_reply": "thanks"},
    {"kind": "message", "text": "Nudge", "next": "end"},
    {"kind": "message", "id": "thanks", "text": "Thanks!"},
)


def test_a_wait_times_out_unless_the_request_assumes_a_reply(
    client: TestClient[Any], runtime: Runtime
) -> None:
    manual(runtime).set(FRIDAY_EVENING)
    sequence = new_sequence(client, *WAIT)
    contact = new_contact(client)

    silent = previewed(client, sequence, contact_id=contact)
    replying = previewed(client, sequence, contact_id=contact, assume_reply=True)

    assert taken(silent) == [
        (0, "queued", None),
        (1, "branched", "no_reply"),
        (2, "queued", None),
        (3, "not_reached", None),
    ]
    assert silent["steps"][1]["at"] == "2030-01-12T21:30:00Z"  # the wait's timeout, a day later
    assert taken(replying) == [
        (0, "queued", None),
        (1, "branched", "replied"),
        (3, "queued", None),
        (2, "not_reached", None),
    ]
    assert replying["steps"][1]["at"] == "2030-01-11T21:30:00Z"  # the reply as the wait begins
    # a wait whose reply stops the enrollment, replied to: it stops there
    stopping = new_sequence(client, WAIT[0], {"kind": "wait_for_reply", "timeout_seconds": 60}, WAIT[2])
    assert taken(previewed(client, stopping, contact_id=contact, assume_reply=True)) == [
        (0, "queued", None),
        (1, "stopped", "replied"),
        (2, "not_reached", None),
    ]


def test_a_reply_assumed_is_the_path_a_real_reply_then_takes(
    client: TestClient[Any], runtime: Runtime
) -> None:
    clock = manual(runtime)
    clock.set(FRIDAY_EVENING)
    # the service window enforced: the contact never wrote, so the first step is skipped; the reply opens
    # the window, so the reply path's message goes as written
    ok(client.put("/v1/settings", json={"service_window": "enforced"}))
    sequence = new_sequence(client, *WAIT)
    contact = new_contact(client)
    answer = previewed(client, sequence, contact_id=contact, assume_reply=True)

    # the contact enrolled for real replies as the wait begins (its first step's release)
    enrollment = ok(
        client.post("/v1/enrollments", json={"sequence_id": sequence, "contact_id": contact}), 201
    )["id"]
    first = release_one(runtime.pool, clock, SETTINGS)
    assert first is not None and first.action == "skip"
    inbound(client, contact)
    real = [(0, "skip", first.reason, clock.now()), *released_for_real(runtime, enrollment)]

    # the preview's releases are the real ones; its wait's path is the one the reply's own stop path took
    assert real == [step for step in as_released(answer) if step[0] != 1]
    assert taken(answer)[:3] == [
        (0, "skipped", "outside_service_window"),
        (1, "branched", "replied"),
        (3, "queued", None),
    ]
    assert answer["steps"][2]["text"] == "Thanks!"
