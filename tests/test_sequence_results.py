"""A sequence's results per path and variant (``GET /v1/sequences/{id}/statistics``: ``paths``,
``experiments``, ``conversions``) and choosing an experiment's winner
(``POST /v1/sequences/{id}/experiments/{experiment}/winner``). The definitions are those of docs/api.md,
"Statistics" and "Experiments"."""

from __future__ import annotations

import logging
import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.runtime import Runtime
from libs.common.followups.statistics import wilson_interval
from tests.conftest import Project, sign_in
from tests.helpers import rows
from tests.release_helpers import sample
from tests.rule_helpers import post_event
from tests.test_api_sequences import assert_problem, enroll, message_step, new_contact, published, release
from tests.test_sequence_statistics import statistics

WINNERS = "followups_experiment_winners_total"

#: A welcome, a branch on a tag, an experiment (a, b and a holdout), each variant's message, a wait for a
#: reply whose reply path thanks the contact.
STEPS = (
    message_step("Welcome"),
    {
        "kind": "branch",
        "paths": [
            {
                "name": "vip",
                "when": {"attribute": "contact.tags", "operator": "contains", "value": "vip"},
                "to": "split",
            }
        ],
        "otherwise": "split",
    },
    {
        "kind": "split",
        "id": "split",
        "experiment": "offer",
        "variants": [{"name": "a", "to": "a"}, {"name": "b", "to": "b"}],
        "holdout_weight": 1,
    },
    message_step("Offer A", id="a", next="wait"),
    message_step("Offer B", id="b", next="wait"),
    {
        "kind": "wait_for_reply",
        "id": "wait",
        "timeout_seconds": 3600,
        "on_reply": "thanks",
        "on_timeout": "end",
    },
    message_step("Thanks", id="thanks"),
)
GOALS = [{"name": "won", "event": "lead.status_changed"}, {"name": "booked", "event": "contact.tag_added"}]


def run(pool: ConnectionPool, enrollment_id: str, step_index: int, outcome: str, reason: str | None) -> None:
    """A step run, as the release records it (a fixture for the statistics read)."""
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO followup_step_runs (project_id, enrollment_id, step_index, outcome, reason, due_at,"
            " ran_at) SELECT project_id, id, %s, %s, %s, now(), now() FROM followup_enrollments"
            " WHERE id = %s",
            (step_index, outcome, reason, enrollment_id),
        )


def finish(pool: ConnectionPool, enrollment_id: str, **columns: Any) -> None:
    """Set an enrollment's columns as the release, a stop or a goal would (a fixture for the read)."""
    if "assignments" in columns:
        columns["assignments"] = Jsonb(columns["assignments"])
    names = ", ".join(f"{name} = %s" for name in columns)
    with pool.connection() as conn:
        conn.execute(
            f"UPDATE followup_enrollments SET {names} WHERE id = %s",  # the names are this test's
            (*columns.values(), enrollment_id),
        )


#: Each enrollment of the fixture: (branch path, variant, queued steps after the split, wait path, status,
#: reason, a reply path taken, goal, converted step, converted late).
PEOPLE = [
    ("path:vip", "a", [3], "no_reply", "completed", None, False, "won", 3, False),
    ("otherwise", "a", [3], "replied", "converted", "won", True, "won", 6, False),
    ("otherwise", "a", [3], None, "stopped", "replied", False, None, None, False),
    ("otherwise", "a", [3], "no_reply", "completed", None, False, None, None, False),
    ("otherwise", "a", [], None, "stopped", "opted_out", False, None, None, False),
    ("path:vip", "b", [4], "no_reply", "completed", None, False, "won", 4, True),
    ("otherwise", "b", [4], None, "active", None, False, None, None, False),
    ("otherwise", "b", [4], None, "active", None, False, None, None, False),
    ("otherwise", "holdout", [], None, "completed", None, False, "booked", 0, True),
    ("otherwise", "holdout", [], None, "completed", None, False, None, None, False),
]


def populated(client: TestClient[Any], pool: ConnectionPool, clock: ManualClock) -> str:
    """The sequence of :data:`STEPS`, its enrollments made through the API and taken down the paths of
    :data:`PEOPLE` (their step runs and columns written as the release would)."""
    sequence_id = published(client, *STEPS, goals=GOALS)
    now = clock.now()
    for branch, variant, queued, wait, status, reason, reply_taken, goal, step, late in PEOPLE:
        enrollment = enroll(client, sequence_id, new_contact(client))["id"]
        run(pool, enrollment, 0, "queued", None)
        run(pool, enrollment, 1, "branched", branch)
        run(pool, enrollment, 2, "branched", "holdout" if variant == "holdout" else f"variant:{variant}")
        for index in queued:
            run(pool, enrollment, index, "queued", None)
        if wait is not None:
            run(pool, enrollment, 5, "branched", wait)
        if wait == "replied":
            run(pool, enrollment, 6, "queued", None)
        finish(
            pool,
            enrollment,
            status=status,
            reason=reason,
            reply_taken_at=now if reply_taken else None,
            goal=goal,
            converted_step=step,
            converted_at=(now + timedelta(days=1) if late else now) if goal else None,
            finished_at=None if status == "active" else now,
            assignments={"offer": variant},
        )
    return sequence_id


def test_the_funnel_per_path_counts_who_took_it_and_what_followed(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock
) -> None:
    stats = statistics(client, populated(client, pool, clock))

    def path(
        step_index: int, kind: str, name: str, entered: int, sent: int, replied: int, converted: int
    ) -> Any:
        return {
            "step_index": step_index,
            "kind": kind,
            "path": name,
            "entered": entered,
            "sent": sent,
            "replied": replied,
            "converted": converted,
        }

    assert stats["paths"] == [
        path(1, "branch", "otherwise", 8, 5, 2, 2),
        path(1, "branch", "path:vip", 2, 2, 0, 2),
        path(2, "split", "holdout", 2, 0, 0, 1),
        path(2, "split", "variant:a", 5, 4, 2, 2),
        path(2, "split", "variant:b", 3, 3, 0, 1),
        path(5, "wait_for_reply", "no_reply", 3, 0, 0, 2),
        path(5, "wait_for_reply", "replied", 1, 1, 1, 1),
    ]
    # a control step's run is neither a message nor a skip
    assert stats["skipped"] == 0
    assert [s["skipped"] for s in stats["steps"]] == [0] * len(STEPS)
    assert stats["messages"]["total"] == 10 + 7 + 1


def test_each_variant_has_its_counts_rate_and_wilson_interval(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock
) -> None:
    stats = statistics(client, populated(client, pool, clock))
    [offer] = stats["experiments"]
    assert (offer["experiment"], offer["step_index"], offer["winner"], offer["winner_chosen_at"]) == (
        "offer",
        2,
        None,
        None,
    )
    by_variant = {v["variant"]: v for v in offer["variants"]}
    assert list(by_variant) == ["a", "b", "holdout"]
    counts = {
        name: tuple(v[k] for k in ("assigned", "sent", "replied", "converted"))
        for name, v in by_variant.items()
    }
    assert counts == {"a": (5, 4, 2, 2), "b": (3, 3, 0, 1), "holdout": (2, 0, 0, 1)}
    assert by_variant["a"]["conversion_rate"] == 0.4
    assert by_variant["b"]["conversion_rate"] == pytest.approx(1 / 3, abs=1e-6)
    assert by_variant["holdout"]["conversion_rate"] == 0.5
    # the Wilson score interval, by hand: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), z = 1.96
    assert by_variant["a"]["conversion_interval"] == pytest.approx([0.1176, 0.7693], abs=1e-4)
    assert by_variant["b"]["conversion_interval"] == pytest.approx([0.0615, 0.7923], abs=1e-4)
    assert by_variant["holdout"]["conversion_interval"] == pytest.approx([0.0945, 0.9055], abs=1e-4)


def test_the_wilson_interval_at_its_edges() -> None:
    assert wilson_interval(0, 0) is None
    low, high = wilson_interval(0, 10) or (None, None)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(10, 10) or (None, None)
    assert low == pytest.approx(0.7225, abs=1e-4) and high == 1.0
    low, high = wilson_interval(50, 100) or (None, None)
    assert (low, high) == pytest.approx((0.4038, 0.5962), abs=1e-4)


def test_conversions_live_and_late_are_counted_once_by_goal_and_step(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock
) -> None:
    stats = statistics(client, populated(client, pool, clock))
    # one live conversion (status converted), three late ones (a finished enrollment's converted_at)
    assert stats["converted"] == 1
    assert stats["conversions"] == {
        "converted": 4,
        "by_goal": {"booked": 1, "won": 3},
        "by_step": [
            {"step_index": 0, "converted": 1},
            {"step_index": 3, "converted": 1},
            {"step_index": 4, "converted": 1},
            {"step_index": 6, "converted": 1},
        ],
    }
    # the enrollments by status add up, the new statuses included
    statuses = ("active", "paused", "completed", "stopped", "failed", "converted", "exited")
    assert sum(stats[s] for s in statuses) == stats["enrolled"] == len(PEOPLE)


def test_another_project_neither_reads_the_results_nor_chooses_a_winner(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock, other_project: Project
) -> None:
    sequence_id = populated(client, pool, clock)
    response = client.get(f"/v1/sequences/{sequence_id}/statistics", headers=other_project.headers)
    assert_problem(response, 404, "sequence_id")
    assert_problem(
        winner_of(client, sequence_id, "offer", "a", headers=other_project.headers), 404, "sequence_id"
    )
    assert statistics(client, sequence_id)["enrolled"] == len(PEOPLE)
    assert client.get(f"/v1/sequences/{sequence_id}").json()["current_version"] == 1


def test_the_results_of_enrollments_taken_down_the_paths_by_the_release(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    """End to end: enrollments through the API, the real release down the branch, the split and the wait,
    a reply through ``POST /v1/events``; the statistics agree with where each enrollment went."""
    sequence_id = published(client, *STEPS)
    contacts = [new_contact(client, tags=["vip"] if n < 3 else []) for n in range(12)]
    enrollments = [enroll(client, sequence_id, contact)["id"] for contact in contacts]
    settle(runtime, clock)  # each at the wait (a variant) or completed (the holdout)
    variants = {
        e: v for e, v in rows(pool, "SELECT id::text, assignments ->> 'offer' FROM followup_enrollments")
    }
    assert set(variants) == set(enrollments)
    # the first contact in a variant replies during the wait: its reply path ("thanks")
    replier = next(i for i, e in enumerate(enrollments) if variants[e] != "holdout")
    post_event(
        client,
        {
            "type": "message.inbound",
            "contact_id": contacts[replier],
            "provider_message_id": str(uuid.uuid4()),
        },
    )
    settle(runtime, clock)
    clock.advance(timedelta(hours=2))  # the others' waits time out: the timeout path ends them
    settle(runtime, clock)
    assert rows(pool, "SELECT DISTINCT status FROM followup_enrollments") == [("completed",)]

    stats = statistics(client, sequence_id)
    arms = [variants[e] for e in enrollments]
    waiting = len([v for v in arms if v != "holdout"])
    by_path = {(p["step_index"], p["path"]): p for p in stats["paths"]}
    assert {k: (p["entered"], p["sent"]) for k, p in by_path.items() if k[0] == 1} == {
        (1, "path:vip"): (3, 3 - arms[:3].count("holdout")),
        (1, "otherwise"): (9, 9 - arms[3:].count("holdout")),
    }
    assert (by_path[(5, "replied")]["entered"], by_path[(5, "replied")]["sent"]) == (1, 1)
    assert by_path[(5, "replied")]["replied"] == 1  # the reply path taken
    assert (by_path[(5, "no_reply")]["entered"], by_path[(5, "no_reply")]["sent"]) == (waiting - 1, 0)
    [offer] = stats["experiments"]
    counted = {v["variant"]: (v["assigned"], v["sent"], v["replied"]) for v in offer["variants"]}
    expected = {
        name: (arms.count(name), 0 if name == "holdout" else arms.count(name), int(arms[replier] == name))
        for name in ("a", "b", "holdout")
    }
    assert counted == expected
    split = {p: by_path.get((2, p), {"entered": 0})["entered"] for p in ("variant:a", "variant:b", "holdout")}
    assert split == {
        "variant:a": arms.count("a"),
        "variant:b": arms.count("b"),
        "holdout": arms.count("holdout"),
    }
    # the messages the control steps sent are none; the variants' and the thanks are their steps'
    assert [s["messages"]["total"] for s in stats["steps"]] == [
        12,
        0,
        0,
        arms.count("a"),
        arms.count("b"),
        0,
        1,
    ]
    assert stats["skipped"] == 0 and stats["conversions"]["converted"] == 0


def settle(runtime: Runtime, clock: ManualClock) -> None:
    """Release until nothing is due, a minute at a time (each contact's spacing between two follow-ups)."""
    for _ in range(30):
        release(runtime)
        clock.advance(timedelta(minutes=1))


# --- choosing a winner ------------------------------------------------------------------------------------


def winner_of(client: TestClient[Any], sequence_id: str, experiment: str, variant: Any, **fields: Any) -> Any:
    return client.post(
        f"/v1/sequences/{sequence_id}/experiments/{experiment}/winner", json={"variant": variant}, **fields
    )


def test_choosing_a_winner_publishes_a_new_version_and_records_it(
    client: TestClient[Any],
    pool: ConnectionPool,
    clock: ManualClock,
    project: Project,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    sequence_id = published(client, *STEPS, goals=GOALS)
    chosen = sample(WINNERS, result="chosen")
    response = winner_of(client, sequence_id, "offer", "b")
    assert response.status_code == 201, response.text
    winner = response.json()
    assert (winner["sequence_id"], winner["experiment"], winner["variant"], winner["version"]) == (
        sequence_id,
        "offer",
        "b",
        2,
    )
    assert sample(WINNERS, result="chosen") == chosen + 1
    [record] = [r for r in caplog.records if r.getMessage() == "experiment winner chosen"]
    logged = {
        k: record.__dict__[k] for k in ("project_id", "sequence_id", "experiment", "variant", "version")
    }
    assert logged == {
        "project_id": str(project.id),
        "sequence_id": sequence_id,
        "experiment": "offer",
        "variant": "b",
        "version": 2,
    }
    # the new version is the current one: the previous definition, with the split's winner
    sequence = client.get(f"/v1/sequences/{sequence_id}").json()
    assert (sequence["current_version"], sequence["current_version_id"]) == (2, winner["version_id"])
    first = client.get(f"/v1/sequences/{sequence_id}/versions/1").json()["definition"]
    second = client.get(f"/v1/sequences/{sequence_id}/versions/2").json()["definition"]
    assert second["steps"][2]["winner"] == "b" and first["steps"][2]["winner"] is None
    first["steps"][2]["winner"] = "b"
    assert first == second
    # the draft carries it too (publishing the draft again makes nothing new)
    assert sequence["draft"]["steps"][2]["winner"] == "b"
    assert client.post(f"/v1/sequences/{sequence_id}/publish").status_code == 200
    # the table the release reads
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT project_id, experiment, variant, version_id::text, chosen_at"
            " FROM followup_experiment_winners WHERE sequence_id = %s",
            (sequence_id,),
        ).fetchall()
    assert rows == [(project.id, "offer", "b", winner["version_id"], clock.now())]
    # and the statistics name it
    [offer] = statistics(client, sequence_id)["experiments"]
    assert offer["winner"] == "b"


def test_choosing_the_same_winner_again_changes_nothing(client: TestClient[Any], clock: ManualClock) -> None:
    sequence_id = published(client, *STEPS)
    first = winner_of(client, sequence_id, "offer", "a")
    assert first.status_code == 201, first.text
    clock.advance(timedelta(minutes=5))
    unchanged = sample(WINNERS, result="unchanged")
    again = winner_of(client, sequence_id, "offer", "a")
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert sample(WINNERS, result="unchanged") == unchanged + 1
    assert client.get(f"/v1/sequences/{sequence_id}").json()["current_version"] == 2
    # another variant is a new choice, and a new version
    other = winner_of(client, sequence_id, "offer", "b")
    assert other.status_code == 201, other.text
    assert (other.json()["version"], other.json()["chosen_at"]) == (
        3,
        clock.now().isoformat().replace("+00:00", "Z"),
    )


def test_a_published_winner_is_recorded_and_clearing_it_runs_the_experiment_again(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock
) -> None:
    def winners() -> list[tuple[str, str]]:
        return rows(
            pool,
            "SELECT experiment, variant FROM followup_experiment_winners WHERE sequence_id = %s",
            sequence_id,
        )

    steps = list(STEPS)
    steps[2] = {**STEPS[2], "winner": "a"}
    sequence_id = published(client, *steps)  # a winner written in the definition, published
    assert winners() == [("offer", "a")]
    # choosing the same one through the API is nothing new
    again = winner_of(client, sequence_id, "offer", "a")
    assert again.status_code == 200 and again.json()["version"] == 1
    # a version whose split names no winner: the experiment runs again, on every version
    steps[2] = STEPS[2]
    assert (
        client.patch(f"/v1/sequences/{sequence_id}", json={"definition": {"steps": steps}}).status_code == 200
    )
    assert client.post(f"/v1/sequences/{sequence_id}/publish").status_code == 201
    assert winners() == []
    assert statistics(client, sequence_id)["experiments"][0]["winner"] is None


def test_an_unknown_experiment_or_variant_is_422_naming_it(client: TestClient[Any]) -> None:
    sequence_id = published(client, *STEPS)
    assert_problem(winner_of(client, sequence_id, "pricing", "a"), 422, "experiment")
    assert_problem(winner_of(client, sequence_id, "offer", "c"), 422, "variant")
    assert_problem(winner_of(client, sequence_id, "offer", "holdout"), 422, "variant")
    assert_problem(winner_of(client, sequence_id, "offer", 7), 400)
    response = client.post(f"/v1/sequences/{sequence_id}/experiments/offer/winner", json={})
    assert response.status_code in (400, 422), response.text
    # a sequence never published has no experiment
    draft = client.post("/v1/sequences", json={"name": "draft", "definition": {"steps": list(STEPS)}}).json()
    assert_problem(winner_of(client, draft["id"], "offer", "a"), 422, "experiment")
    # nothing was published or recorded
    assert client.get(f"/v1/sequences/{sequence_id}").json()["current_version"] == 1


def test_another_projects_sequence_is_404(client: TestClient[Any], other_project: Project) -> None:
    assert_problem(winner_of(client, str(uuid.uuid4()), "offer", "a"), 404, "sequence_id")


def test_an_archived_sequence_is_409(client: TestClient[Any]) -> None:
    sequence_id = published(client, *STEPS)
    assert client.post(f"/v1/sequences/{sequence_id}/archive").status_code == 200
    assert_problem(winner_of(client, sequence_id, "offer", "a"), 409)


def test_a_winner_chosen_through_the_api_routes_enrollments_on_the_older_version_too(
    client: TestClient[Any], pool: ConnectionPool, runtime: Runtime, clock: ManualClock
) -> None:
    steps = list(STEPS)
    steps[2] = {**STEPS[2], "delay_seconds": 3600}  # the split an hour after the branch
    sequence_id = published(client, *steps)
    older = [enroll(client, sequence_id, new_contact(client))["id"] for _ in range(6)]
    settle(runtime, clock)  # "Welcome" and the branch for each: the split due in an hour, on version 1
    chose = winner_of(client, sequence_id, "offer", "b")
    assert chose.status_code == 201, chose.text
    newer = enroll(client, sequence_id, new_contact(client))
    assert newer["version_id"] == chose.json()["version_id"]
    for _ in range(2):  # the older ones' split, then the newer one's
        clock.advance(timedelta(hours=1))
        settle(runtime, clock)
    assigned = rows(pool, "SELECT id::text, assignments FROM followup_enrollments")
    assert {e: a for e, a in assigned} == {e: {"offer": "b"} for e in [*older, newer["id"]]}
    [offer] = statistics(client, sequence_id)["experiments"]
    assert offer["winner"] == "b"
    assert [(v["variant"], v["assigned"]) for v in offer["variants"]] == [("a", 0), ("b", 7), ("holdout", 0)]


# --- the dashboard's results page -------------------------------------------------------------------------


def test_the_results_page_shows_each_path_and_variant_and_chooses_a_winner(
    client: TestClient[Any], pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    sequence_id = populated(client, pool, clock)
    browser, token = client, sign_in(client, project)  # the same client signed in to the dashboard
    page = browser.get(f"/app/sequences/{sequence_id}/results").text
    # the funnel per path: its chart (described in words) and its table
    assert "Step 3 split: variant a: 5 entered, 4 sent a follow-up, 2 replied, 2 converted" in page
    row = re.search(r'<tr data-step="5" data-path="replied">.*?</tr>', page, re.S)
    assert row and 'data-count="entered">1<' in row.group(0) and 'data-count="sent">1<' in row.group(0)
    # the variants: counts, rate, interval, and a button for each variant (not the holdout)
    variants = dict(re.findall(r'<tr data-variant="(\w+)">(.*?)</tr>', page, re.S))
    assert list(variants) == ["a", "b", "holdout"]
    assert 'data-count="rate">40.0 %<' in variants["a"] and "11.8 % to 76.9 %" in variants["a"]
    assert 'data-count="assigned">3<' in variants["b"] and "6.1 % to 79.2 %" in variants["b"]
    assert "Choose winner" in variants["a"] and "Choose winner" in variants["b"]
    assert "Choose winner" not in variants["holdout"]
    assert '<tr data-goal="won"><td>won</td><td class="num">3</td></tr>' in page
    # a step that sends nothing says so in the per-step table
    assert '<tr data-step="2"><td>Step 3 <span class="muted">(split: its runs are in Paths)</span>' in page
    # choosing b: the domain function the API calls, a new version, the page names the winner
    chose = browser.post(
        f"/app/sequences/{sequence_id}/experiments/offer/winner",
        data={"_csrf": token, "variant": "b"},
        follow_redirects=False,
    )
    assert chose.status_code == 303, chose.text
    assert chose.headers["location"] == f"/app/sequences/{sequence_id}/results?notice=winner_chosen"
    page = browser.get(chose.headers["location"]).text
    assert "Winner chosen" in page and "Winner: <strong>b</strong>" in page
    variants = dict(re.findall(r'<tr data-variant="(\w+)">(.*?)</tr>', page, re.S))
    assert "winner</span>" in variants["b"] and "Choose winner" not in variants["b"]
    assert client.get(f"/v1/sequences/{sequence_id}").json()["current_version"] == 2
    # a variant the split does not have is refused on the page, naming it
    refused = browser.post(
        f"/app/sequences/{sequence_id}/experiments/offer/winner", data={"_csrf": token, "variant": "zzz"}
    )
    assert refused.status_code == 422 and "offer has no variant named zzz" in refused.text
    assert client.get(f"/v1/sequences/{sequence_id}").json()["current_version"] == 2
