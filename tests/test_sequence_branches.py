"""Sequences that branch, through the API and the real release (issue 28): a branch on the contact's tags
and on whether the previous follow-up was read, a wait for a reply (the reply path taken at once by the
reply's own event, or the timeout path), a split with a holdout and a chosen winner, paths that end and
rejoin; and the definitions the API refuses, naming the field."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups import graph
from libs.common.followups.definition import decode_definition
from tests.helpers import rows
from tests.platform_event_helpers import post_event
from tests.test_api_sequences import assert_problem, enroll, message_step, new_contact, published, release

HOUR = timedelta(hours=1)


def tagged(client: TestClient[Any], *tags: str) -> str:
    return new_contact(client, tags=list(tags))


def runs(pool: ConnectionPool, enrollment_id: str) -> list[tuple[int, str, str | None]]:
    """(step index, outcome, reason) of the enrollment's step runs, in the order they ran."""
    found: list[tuple[int, str, str | None]] = rows(
        pool,
        "SELECT step_index, outcome, reason FROM followup_step_runs WHERE enrollment_id = %s"
        " ORDER BY ran_at, step_index",
        enrollment_id,
    )
    return found


def sent(pool: ConnectionPool, enrollment_id: str) -> list[str]:
    """The enrollment's follow-up messages, in the order they were queued (a reply cancels one still
    queued: no send lane runs here)."""
    found = rows(
        pool,
        "SELECT body FROM messages WHERE followup_enrollment_id = %s"
        " ORDER BY created_at, followup_step_index",
        enrollment_id,
    )
    return [body for (body,) in found]


def status(pool: ConnectionPool, enrollment_id: str) -> tuple[Any, ...]:
    [found] = rows(
        pool,
        "SELECT status, reason, assignments, reply_step FROM followup_enrollments WHERE id = %s",
        enrollment_id,
    )
    return tuple(found)


def drain(runtime: Runtime, clock: ManualClock, hours: int = 24 * 30) -> None:
    """Release everything due, hour by hour, for ``hours``."""
    release(runtime)
    for _ in range(hours):
        clock.advance(HOUR)
        release(runtime)


def inbound(client: TestClient[Any], contact_id: str) -> dict[str, Any]:
    event = {"type": "message.inbound", "contact_id": contact_id, "provider_message_id": str(uuid.uuid4())}
    return post_event(client, event)


VIP = {"attribute": "contact.tags", "operator": "contains", "value": "vip"}


def branch_sequence(client: TestClient[Any]) -> str:
    """hello -> branch: vip -> "vip offer" (ends); read -> "glad you saw it" (rejoins); otherwise ->
    "standard offer" -> "bye" (the rejoin)."""
    return published(
        client,
        message_step("hello"),
        {
            "kind": "branch",
            "delay_seconds": 3600,
            "paths": [
                {"name": "vip", "when": VIP, "to": "vip"},
                {"name": "seen", "read": True, "to": "seen"},
            ],
        },
        message_step("standard offer", next="bye"),
        message_step("vip offer", id="vip", next="end"),
        message_step("glad you saw it", id="seen"),
        message_step("bye", id="bye", delay_seconds=3600),
    )


def test_a_branch_sends_each_contact_down_the_first_path_that_holds(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = branch_sequence(client)
    vip = enroll(client, sequence_id, tagged(client, "vip"))["id"]
    plain = enroll(client, sequence_id, tagged(client))["id"]
    drain(runtime, clock)
    # the vip path ends; the other takes otherwise, then the step it rejoins at
    assert sent(pool, vip) == ["hello", "vip offer"]
    assert runs(pool, vip) == [(0, "queued", None), (1, "branched", "path:vip"), (3, "queued", None)]
    assert status(pool, vip)[:2] == ("completed", None)
    assert sent(pool, plain) == ["hello", "standard offer", "bye"]
    assert [r[:3] for r in runs(pool, plain)] == [
        (0, "queued", None),
        (1, "branched", "otherwise"),
        (2, "queued", None),
        (5, "queued", None),
    ]
    assert status(pool, plain)[0] == "completed"


def test_a_branch_on_the_previous_follow_up_read(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = branch_sequence(client)
    enrollment = enroll(client, sequence_id, tagged(client))["id"]
    release(runtime)
    [(message_id,)] = rows(pool, "SELECT id FROM messages WHERE followup_enrollment_id = %s", enrollment)
    for state in ("SENT", "DELIVERED", "READ"):
        post_event(client, {"type": "message.status", "message_id": str(message_id), "status": state}, 200)
    drain(runtime, clock)
    assert sent(pool, enrollment) == ["hello", "glad you saw it", "bye"]
    assert (1, "branched", "path:seen") in runs(pool, enrollment)


def wait_sequence(client: TestClient[Any], **stop_on: bool) -> str:
    """ask -> wait a day: a reply -> "thanks" (then "more"); none -> "nudge" (ends)."""
    return published(
        client,
        message_step("ask"),
        {"kind": "wait_for_reply", "timeout_seconds": 86400, "on_reply": "thanks", "on_timeout": "nudge"},
        message_step("nudge", id="nudge", next="end"),
        message_step("thanks", id="thanks"),
        message_step("more", delay_seconds=3600),
        stop_on={"reply": True, **stop_on},
    )


def test_a_reply_during_the_wait_takes_the_reply_path_at_once(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = wait_sequence(client)
    contact_id = tagged(client)
    enrollment = enroll(client, sequence_id, contact_id)["id"]
    release(runtime)
    assert status(pool, enrollment)[3] == 3  # waiting, the reply path kept on the enrollment
    clock.advance(HOUR)
    answer = inbound(client, contact_id)
    # the reply's own event moved it: not stopped, its wait's run says replied, the reply path is next
    assert answer["stopped_enrollment_ids"] == []
    assert status(pool, enrollment)[:2] == ("active", None)
    assert runs(pool, enrollment)[-1] == (1, "branched", "replied")
    release(runtime)
    assert sent(pool, enrollment) == ["ask", "thanks"]
    drain(runtime, clock, hours=48)
    assert sent(pool, enrollment) == ["ask", "thanks", "more"]
    assert status(pool, enrollment)[0] == "completed"


def test_a_second_reply_on_the_reply_path_stops_it_as_a_reply_always_does(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = wait_sequence(client)
    contact_id = tagged(client)
    enrollment = enroll(client, sequence_id, contact_id)["id"]
    release(runtime)
    inbound(client, contact_id)
    release(runtime)  # "thanks"
    clock.advance(timedelta(minutes=5))
    answer = inbound(client, contact_id)
    assert answer["stopped_enrollment_ids"] == [enrollment]
    drain(runtime, clock, hours=4)
    assert sent(pool, enrollment) == ["ask", "thanks"]
    assert status(pool, enrollment)[:2] == ("stopped", "replied")


def test_no_reply_by_the_deadline_takes_the_timeout_path(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = wait_sequence(client)
    enrollment = enroll(client, sequence_id, tagged(client))["id"]
    drain(runtime, clock, hours=30)
    assert sent(pool, enrollment) == ["ask", "nudge"]
    assert (1, "branched", "no_reply") in runs(pool, enrollment)
    assert status(pool, enrollment)[0] == "completed"


def test_a_wait_without_a_reply_path_stops_on_the_reply_as_before(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = published(
        client,
        message_step("ask"),
        {"kind": "wait_for_reply", "timeout_seconds": 3600},
        message_step("nudge"),
    )
    contact_id = tagged(client)
    enrollment = enroll(client, sequence_id, contact_id)["id"]
    release(runtime)
    assert status(pool, enrollment)[3] is None
    assert inbound(client, contact_id)["stopped_enrollment_ids"] == [enrollment]
    drain(runtime, clock, hours=3)
    assert sent(pool, enrollment) == ["ask"]


def split_sequence(client: TestClient[Any], **split: Any) -> str:
    return published(
        client,
        message_step("hello"),
        {
            "kind": "split",
            "experiment": "offer",
            "variants": [{"name": "a", "weight": 1, "to": "a"}, {"name": "b", "weight": 1, "to": "b"}],
            "holdout_weight": 1,
            **split,
        },
        message_step("offer a", id="a", next="end"),
        message_step("offer b", id="b"),
    )


def test_a_split_assigns_each_contact_its_variant_or_the_holdout_and_records_it(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = split_sequence(client)
    enrollments = {enroll(client, sequence_id, tagged(client))["id"] for _ in range(12)}
    drain(runtime, clock, hours=3)
    [(version,)] = rows(
        pool, "SELECT definition FROM followup_sequence_versions WHERE sequence_id = %s", sequence_id
    )
    definition = decode_definition(version)
    seen = set()
    for enrollment in enrollments:
        [(contact_id,)] = rows(pool, "SELECT contact_id FROM followup_enrollments WHERE id = %s", enrollment)
        expected = graph.assign(definition, 1, uuid.UUID(sequence_id), contact_id)
        seen.add(expected.variant)
        assert status(pool, enrollment)[2] == {"offer": expected.variant}
        bodies = {"a": ["hello", "offer a"], "b": ["hello", "offer b"], "holdout": ["hello"]}
        assert sent(pool, enrollment) == bodies[expected.variant]
        reason = "holdout" if expected.variant == "holdout" else f"variant:{expected.variant}"
        assert (1, "branched", reason) in runs(pool, enrollment)
        assert status(pool, enrollment)[0] == "completed"
    assert len(seen) >= 2


def test_a_winner_chosen_routes_everyone_reaching_the_split_on_any_version(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = split_sequence(client, delay_seconds=3600)
    enrollments = [enroll(client, sequence_id, tagged(client))["id"] for _ in range(6)]
    release(runtime)  # "hello" for each, the split due in an hour
    [(project_id, version_id)] = rows(
        pool, "SELECT project_id, current_version_id FROM followup_sequences WHERE id = %s", sequence_id
    )
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO followup_experiment_winners"
            " (project_id, sequence_id, experiment, variant, version_id, chosen_at)"
            " VALUES (%s, %s, 'offer', 'b', %s, now())",
            (project_id, sequence_id, version_id),
        )
    drain(runtime, clock, hours=1)
    for enrollment in enrollments:
        assert status(pool, enrollment)[2] == {"offer": "b"}
        assert sent(pool, enrollment) == ["hello", "offer b"]


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([message_step("a", next="nowhere")], "definition.steps.0.next"),
        ([message_step("a", id="x"), message_step("b", next="x")], "definition.steps.1.next"),
        ([message_step("a", id="end")], "definition.steps.0.id"),
        ([message_step("a", id="x"), message_step("b", id="x")], "definition.steps.1.id"),
        (
            [message_step("a"), {"kind": "branch", "paths": [{"name": "p", "to": "q"}]}],
            "definition.steps.1.paths.0.to",
        ),
        (
            [
                message_step("a"),
                {
                    "kind": "branch",
                    "paths": [
                        {
                            "name": "p",
                            "when": {"attribute": "message.content", "operator": "contains", "value": "x"},
                            "to": "end",
                        }
                    ],
                },
            ],
            "definition.steps.1.paths.0.when.attribute",
        ),
        ([{"kind": "wait_for_reply", "timeout_seconds": 60}, message_step("a")], "definition.steps.0.kind"),
        (
            [
                message_step("a"),
                {"kind": "split", "experiment": "e", "variants": [{"name": "v", "to": "end"}]},
            ],
            "definition.steps.1.variants",
        ),
        (
            [
                message_step("a"),
                {
                    "kind": "split",
                    "experiment": "e",
                    "winner": "z",
                    "variants": [{"name": "v", "to": "end"}, {"name": "w", "to": "end"}],
                },
            ],
            "definition.steps.1.winner",
        ),
    ],
)
def test_a_definition_whose_paths_cannot_be_followed_is_refused_naming_the_field(
    client: TestClient[Any], steps: list[dict[str, Any]], field: str
) -> None:
    response = client.post("/v1/sequences", json={"name": "bad", "definition": {"steps": steps}})
    created = response.json()
    publish = (
        client.post(f"/v1/sequences/{created['id']}/publish") if response.status_code == 201 else response
    )
    body = assert_problem(publish, 422)
    assert field in {error["field"] for error in body["errors"]}, body


def test_a_wait_that_stops_on_a_reply_needs_stop_on_reply(client: TestClient[Any]) -> None:
    response = client.post(
        "/v1/sequences",
        json={
            "name": "bad",
            "definition": {
                "steps": [message_step("a"), {"kind": "wait_for_reply", "timeout_seconds": 60}],
                "stop_on": {"reply": False},
            },
        },
    )
    publish = client.post(f"/v1/sequences/{response.json()['id']}/publish")
    body = assert_problem(publish, 422)
    assert "definition.steps.1.on_reply" in {error["field"] for error in body["errors"]}


def test_a_reply_path_that_waits_again_takes_the_next_reply_path_too(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = published(
        client,
        message_step("ask"),
        {"kind": "wait_for_reply", "timeout_seconds": 86400, "on_reply": "second", "on_timeout": "end"},
        {"kind": "wait_for_reply", "id": "second", "timeout_seconds": 86400, "on_reply": "thanks"},
        message_step("still there?", next="end"),
        message_step("thanks", id="thanks"),
    )
    contact_id = tagged(client)
    enrollment = enroll(client, sequence_id, contact_id)["id"]
    release(runtime)
    inbound(client, contact_id)
    assert status(pool, enrollment)[3] == 4  # waiting again, its own reply path kept
    clock.advance(HOUR)
    inbound(client, contact_id)
    drain(runtime, clock, hours=2)
    assert sent(pool, enrollment) == ["ask", "thanks"]
    assert [r[:3] for r in runs(pool, enrollment)] == [
        (0, "queued", None),
        (1, "branched", "replied"),
        (2, "branched", "replied"),
        (4, "queued", None),
    ]


def test_the_enrollment_answers_its_assignments_and_the_paths_its_step_runs_took(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock
) -> None:
    sequence_id = split_sequence(client, holdout_weight=0)
    enrollment = enroll(client, sequence_id, tagged(client))["id"]
    drain(runtime, clock, hours=2)
    detail = client.get(f"/v1/enrollments/{enrollment}").json()
    variant = detail["enrollment"]["assignments"]["offer"]
    assert variant in ("a", "b")
    took = [(r["step_index"], r["outcome"], r["reason"], r["reason_detail"]) for r in detail["step_runs"]]
    assert (1, "branched", "variant", variant) in took
