"""After-commit effects (libs.common.core.effects): registered by the domain function that makes a change,
run once the transaction committed and only then; dropped by a rollback (a savepoint's, or a block's that
always rolls back: only its own); identical ones run once; a failing one is logged and the change stays.
End to end: the API's enrollment
nudges the release service, its triggers nudge the triggers service, a refused one nudges nobody; the
workers' job runner runs them after each item's commit (a rule that enrolls, a bulk chunk) and drops them
with a rolled-back item or rule."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import msgspec
import pytest
from dramatiq.brokers.stub import StubBroker
from litestar.testing import TestClient
from prometheus_client import REGISTRY
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.contracts import actors
from libs.common.core import effects
from libs.common.core.clock import ManualClock
from libs.common.core.db import create_pool
from libs.common.core.effects import Invalidate, NudgeRelease, NudgeTriggers
from libs.common.core.jobs import Failed
from libs.common.core.runtime import Runtime
from libs.common.core.settings import Settings
from libs.common.rules import bulk, rules, triggers
from libs.common.rules.actions import run_actions
from libs.common.rules.bulk import BulkCreate
from libs.common.rules.rules import RuleCreate
from tests.conftest import Project
from tests.helpers import rows
from tests.rule_helpers import create_rule
from tests.test_api_sequences import message_step, new_contact, published

# --- helpers


@dataclass
class Seen:
    """What the recording effects saw when they ran."""

    ran: list[str] = field(default_factory=list)
    #: For each run: whether the marker row was visible to another connection (it had been committed).
    committed: list[bool] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Record:
    """An effect that records that it ran, and whether the change was visible from outside by then."""

    name: str
    seen: Seen
    marker: str | None = None
    fail: bool = False

    @property
    def key(self) -> Hashable:
        return ("record", self.name)

    def run(self, runtime: Runtime) -> None:
        if self.fail:
            raise RuntimeError(f"{self.name} failed")
        self.seen.ran.append(self.name)
        if self.marker is not None:
            with runtime.pool.connection() as other:
                found = other.execute("SELECT 1 FROM pg_class WHERE relname = %s", (self.marker,)).fetchone()
            self.seen.committed.append(found is not None)


def marker_table() -> str:
    return f"effects_marker_{uuid.uuid4().hex[:8]}"


def sent(runtime: Runtime, contract: actors.Contract[Any]) -> list[dict[str, Any]]:
    """The payloads of the ``contract`` messages waiting on the runtime's StubBroker."""
    broker = runtime.broker
    assert isinstance(broker, StubBroker)
    messages = [dramatiq.Message.decode(data) for data in list(broker.queues[contract.queue].queue)]
    return [m.args[0] for m in messages if m.actor_name == contract.actor]


# --- when effects run


def test_an_effect_runs_after_the_commit_and_only_then(runtime: Runtime) -> None:
    seen, table = Seen(), marker_table()
    with effects.transaction(runtime) as conn:
        conn.execute(f"CREATE TABLE {table} (id int)")
        effects.after_commit(conn, Record("first", seen, marker=table))
        # Not yet: the block has not ended, nothing is committed
        assert seen.ran == []
        assert [type(e) for e in effects.pending(conn)] == [Record]
    # Then it ran once, and the change was committed (visible to another connection) when it did
    assert seen.ran == ["first"]
    assert seen.committed == [True]


def test_a_rollback_drops_the_effects(runtime: Runtime) -> None:
    seen = Seen()
    with pytest.raises(RuntimeError, match="refused"), effects.transaction(runtime) as conn:
        effects.after_commit(conn, Record("lost", seen))
        raise RuntimeError("refused")
    assert seen.ran == []
    # and the next transaction (the same pooled connection, maybe) does not run it either
    with effects.transaction(runtime) as conn:
        assert effects.pending(conn) == []
        effects.after_commit(conn, Record("next", seen))
    assert seen.ran == ["next"]


def test_a_failed_commit_drops_the_effects(runtime: Runtime) -> None:
    seen = Seen()
    with pytest.raises(Exception, match="deferred_fk"), effects.transaction(runtime) as conn:
        conn.execute(
            "CREATE TEMP TABLE parent (id int PRIMARY KEY);"
            " CREATE TEMP TABLE child (parent_id int REFERENCES parent"
            " DEFERRABLE INITIALLY DEFERRED CONSTRAINT deferred_fk)"
        )
        conn.execute("INSERT INTO child VALUES (1)")  # checked only at COMMIT
        effects.after_commit(conn, Record("never", seen))
    assert seen.ran == []


def test_a_savepoint_rolled_back_drops_only_its_own_effects(runtime: Runtime) -> None:
    seen = Seen()
    with effects.transaction(runtime) as conn:
        effects.after_commit(conn, Record("before", seen))
        with pytest.raises(RuntimeError), effects.savepoint(conn):
            effects.after_commit(conn, Record("inside", seen))
            effects.after_commit(conn, Record("before", seen))  # already registered: kept
            raise RuntimeError("this rule fails")
        with effects.savepoint(conn):
            effects.after_commit(conn, Record("kept", seen))
        effects.after_commit(conn, Record("after", seen))
    assert seen.ran == ["before", "kept", "after"]


def test_a_savepoint_sent_in_a_pipeline_rolls_back_with_only_the_effects_registered_since_it_opened(
    runtime: Runtime,
) -> None:
    seen, table = Seen(), marker_table()
    with effects.transaction(runtime) as conn:
        conn.execute(f"CREATE TABLE {table} (id int)")
        effects.after_commit(conn, Record("before", seen, marker=table))
        point = effects.Savepoint(conn, "attempt")
        with conn.pipeline():  # its SAVEPOINT goes out with the insert
            point.open()
            conn.execute(f"INSERT INTO {table} VALUES (1)")
        effects.after_commit(conn, Record("inside", seen, marker=table))
        point.rollback()
        # opened again, released with the statement after it
        point.open()
        effects.after_commit(conn, Record("kept", seen, marker=table))
        with conn.pipeline():
            conn.execute(f"INSERT INTO {table} VALUES (2)")
            point.release()
    # The rolled-back insert and the effect registered inside it are gone; the others ran after the commit
    assert seen.ran == ["before", "kept"]
    assert seen.committed == [True, True]
    assert rows(runtime.pool, f"SELECT id FROM {table}") == [(2,)]


def test_a_rolled_back_block_keeps_nothing_it_wrote_nor_registered(
    runtime: Runtime, project: Project
) -> None:
    seen = Seen()
    with effects.transaction(runtime) as conn:
        effects.after_commit(conn, Record("before", seen))
        with effects.rolled_back(conn):  # however it ends: here, normally
            effects.after_commit(conn, Record("inside", seen))
            effects.after_commit(conn, Record("before", seen))  # already registered: kept
            conn.execute("UPDATE projects SET name = 'dry' WHERE id = %s", (project.id,))
        conn.execute("SELECT 1")  # the transaction goes on
        effects.after_commit(conn, Record("after", seen))
    assert seen.ran == ["before", "after"]
    assert rows(runtime.pool, "SELECT name FROM projects WHERE id = %s", project.id) == [("test project",)]


def test_identical_effects_run_once_per_transaction(runtime: Runtime) -> None:
    project, other = uuid.uuid4(), uuid.uuid4()
    first = uuid.uuid4()
    with effects.transaction(runtime) as conn:
        effects.after_commit(conn, NudgeRelease(project, first))
        for _ in range(499):  # a bulk makes 500 enrollments due
            effects.after_commit(conn, NudgeRelease(project, uuid.uuid4()))
        effects.after_commit(conn, NudgeRelease(other, first))
        effects.after_commit(conn, NudgeTriggers(project))
        effects.after_commit(conn, NudgeTriggers(project))
    # one release nudge per project (naming the first enrollment), one triggers nudge
    assert sent(runtime, actors.RELEASE_NUDGE) == [
        {"project_id": str(project), "enrollment_id": str(first)},
        {"project_id": str(other), "enrollment_id": str(first)},
    ]
    assert sent(runtime, actors.TRIGGERS_NUDGE) == [{"project_id": str(project)}]


def test_a_failing_effect_is_logged_and_the_change_stays_committed(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    seen, table = Seen(), marker_table()
    with (
        caplog.at_level(logging.ERROR, logger="libs.common.core.effects"),
        effects.transaction(runtime) as conn,
    ):
        conn.execute(f"CREATE TABLE {table} (id int)")
        effects.after_commit(conn, Record("broken", seen, fail=True))
        effects.after_commit(conn, Record("next", seen, marker=table))
    # the block ended normally; the effects after the failing one ran, on the committed change
    assert seen.ran == ["next"]
    assert seen.committed == [True]
    failures = [r for r in caplog.records if r.getMessage() == "after-commit effect failed"]
    assert len(failures) == 1
    assert failures[0].exc_info is not None and "broken failed" in str(failures[0].exc_info[1])


def test_effects_left_on_a_connection_nobody_runs_are_dropped_at_the_next_checkout(
    settings: Settings,
) -> None:
    seen = Seen()
    database = msgspec.structs.replace(settings.database, pool_min_size=1, pool_max_size=1)
    pool: ConnectionPool = create_pool(database, name="followups-test-effects")
    try:
        with pool.connection() as conn:  # a worker's own transaction: no runner
            effects.after_commit(conn, Record("orphan", seen))
            first = conn
        with pool.connection() as conn:
            assert conn is first  # the one connection of the pool
            assert effects.pending(conn) == []
    finally:
        pool.close()
    assert seen.ran == []


# --- end to end


def test_an_enrollment_due_now_nudges_the_release_service_once_committed(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    # Given a published sequence whose first message goes out at once
    sequence_id = published(client, message_step("Hello"))
    contact_id = new_contact(client)
    # When a contact is enrolled through the API
    response = client.post("/v1/enrollments", json={"sequence_id": sequence_id, "contact_id": contact_id})
    assert response.status_code == 201, response.text
    # Then the release service is nudged for it
    enrollment_id = response.json()["id"]
    assert sent(runtime, actors.RELEASE_NUDGE) == [
        {"project_id": str(project.id), "enrollment_id": enrollment_id}
    ]


def test_an_enrollment_not_due_or_refused_nudges_nobody(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    later = published(client, message_step("Tomorrow", delay_seconds=86_400))
    now = published(client, message_step("Now"))
    contact_id = new_contact(client)
    # an enrollment due tomorrow: no nudge
    body = {"sequence_id": later, "contact_id": contact_id}
    assert client.post("/v1/enrollments", json=body).status_code == 201
    assert sent(runtime, actors.RELEASE_NUDGE) == []
    # an enrollment refused (the contact already has a live one in this sequence): rolled back, no nudge
    assert client.post("/v1/enrollments", json=body).status_code == 409
    assert sent(runtime, actors.RELEASE_NUDGE) == []
    # a second one due now: nudged
    assert (
        client.post("/v1/enrollments", json={"sequence_id": now, "contact_id": contact_id}).status_code == 201
    )
    assert [m["project_id"] for m in sent(runtime, actors.RELEASE_NUDGE)] == [str(project.id)]


def test_a_recorded_trigger_nudges_the_triggers_service_and_none_without_a_rule(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    # Without a rule listening, a new contact records no trigger: nobody is nudged
    new_contact(client)
    assert sent(runtime, actors.TRIGGERS_NUDGE) == []
    # With a rule on contact.created, a new contact's trigger nudges the triggers service once committed
    rule = {
        "name": "tag newcomers",
        "event": "contact.created",
        "actions": [{"type": "add_contact_tag", "tags": ["new"]}],
    }
    assert client.post("/v1/rules", json=rule).status_code == 201, "rule"
    new_contact(client)
    assert sent(runtime, actors.TRIGGERS_NUDGE) == [{"project_id": str(project.id)}]


def test_a_rule_change_registers_the_rules_invalidation_and_a_bulk_job_the_triggers_nudge(
    runtime: Runtime, client: TestClient[Any], project: Project
) -> None:
    data = {"name": "r", "event": "contact.created", "actions": [{"type": "add_contact_tag", "tags": ["x"]}]}
    sequence_id = published(client, message_step("Hello"))
    contact_id = new_contact(client)
    with effects.transaction(runtime) as conn:
        rule = rules.create_rule(conn, project.id, msgspec.convert(data, RuleCreate), now=runtime.clock.now())
        rules.delete_rule(conn, project.id, rule.id)
        job = msgspec.convert({"sequence_id": sequence_id, "contact_ids": [contact_id]}, BulkCreate)
        bulk.create_job(conn, project.id, job, now=runtime.clock.now())
        # one invalidation for the project's rules (created, then deleted), one nudge for the bulk job
        assert effects.pending(conn) == [
            Invalidate(rules.INVALIDATION_KIND, project.id),
            NudgeTriggers(project.id),
        ]
    assert sent(runtime, actors.TRIGGERS_NUDGE) == [{"project_id": str(project.id)}]


# --- the workers: the job runner's isolations run them


def enrolling_rule(client: TestClient[Any]) -> str:
    """A rule enrolling each new contact in a sequence whose first message is due at once; the sequence."""
    sequence_id = published(client, message_step("Welcome"))
    actions = [{"type": "enroll_in_sequence", "sequence_id": sequence_id}]
    create_rule(client, "contact.created", actions)
    return sequence_id


def nudged_when_committed(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """For each release nudge sent: how many enrollments another connection saw then (committed ones)."""
    seen: list[int] = []
    nudge = NudgeRelease.run

    def run(self: NudgeRelease, runtime: Runtime) -> None:
        [(count,)] = rows(runtime.pool, "SELECT count(*) FROM followup_enrollments")
        seen.append(count)
        nudge(self, runtime)

    monkeypatch.setattr(NudgeRelease, "run", run)
    return seen


def test_a_rule_that_enrolls_nudges_the_release_service_once_its_trigger_committed(
    client: TestClient[Any], runtime: Runtime, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a rule that enrolls every new contact, and a new contact
    enrolling_rule(client)
    new_contact(client)
    seen = nudged_when_committed(runtime, monkeypatch)
    # When the triggers loop's domain function processes its trigger
    assert triggers.process_triggers(runtime.pool, runtime.clock, runtime=runtime).triggers == 1
    # Then the release service is nudged exactly once, for that enrollment, after its trigger committed
    [(enrollment_id,)] = rows(runtime.pool, "SELECT id FROM followup_enrollments")
    assert sent(runtime, actors.RELEASE_NUDGE) == [
        {"project_id": str(project.id), "enrollment_id": str(enrollment_id)}
    ]
    assert seen == [1]


def test_a_rule_refused_after_one_that_enrolled_keeps_one_enrollment_and_one_nudge(
    client: TestClient[Any], runtime: Runtime, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a rule that enrolls every new contact, then one that labels its conversation (it has none)
    enrolling_rule(client)
    create_rule(client, "contact.created", [{"type": "add_label", "labels": ["never"]}])
    new_contact(client)
    seen = nudged_when_committed(runtime, monkeypatch)
    again = "followups_trigger_rules_run_again_total"
    before = REGISTRY.get_sample_value(again, {"type": "contact.created"}) or 0.0
    # When its trigger is processed: the rules run together, the refusal rolls them back, and they run
    # again one by one (counted)
    processed = triggers.process_triggers(runtime.pool, runtime.clock, runtime=runtime)
    assert REGISTRY.get_sample_value(again, {"type": "contact.created"}) == before + 1
    # Then the contact is enrolled once, the release service nudged once after the commit, each rule's run
    # recorded once
    assert processed.outcomes == {("contact.created", "executed"): 1, ("contact.created", "rejected"): 1}
    [(enrollment_id,)] = rows(runtime.pool, "SELECT id FROM followup_enrollments")
    assert sent(runtime, actors.RELEASE_NUDGE) == [
        {"project_id": str(project.id), "enrollment_id": str(enrollment_id)}
    ]
    assert seen == [1]
    assert sorted(rows(runtime.pool, "SELECT outcome, detail FROM rule_runs")) == [
        ("executed", None),
        ("rejected", "no_conversation"),
    ]


def test_a_trigger_rolled_back_or_a_rule_that_failed_nudges_nobody(
    client: TestClient[Any], runtime: Runtime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    enrolling_rule(client)
    new_contact(client)
    run = triggers._run

    # A statement error after the rule ran rolls the trigger's transaction back: no enrollment, no nudge
    def failing_after(conn: Connection[Any], *args: Any) -> Failed | None:
        failed = run(conn, *args)
        conn.execute("SELECT 1 / 0")
        return failed

    monkeypatch.setattr(triggers, "_run", failing_after)
    processed = triggers.process_triggers(runtime.pool, runtime.clock, runtime=runtime)
    assert processed.outcomes[("contact.created", "retry")] == 1
    assert rows(runtime.pool, "SELECT count(*) FROM followup_enrollments") == [(0,)]
    assert sent(runtime, actors.RELEASE_NUDGE) == []

    # A rule that fails after its enrollment rolls its savepoint back: the trigger's failure commits, with
    # neither the enrollment nor its nudge
    monkeypatch.setattr(triggers, "_run", run)

    def enroll_then_fail(*args: Any, **kwargs: Any) -> Any:
        run_actions(*args, **kwargs)
        raise RuntimeError("the rule's next action failed")

    monkeypatch.setattr(triggers, "send_actions", enroll_then_fail)  # the rules together,
    monkeypatch.setattr(triggers, "run_actions", enroll_then_fail)  # then one by one
    clock.advance(triggers.BACKOFF_MIN)
    processed = triggers.process_triggers(runtime.pool, runtime.clock, runtime=runtime)
    assert processed.outcomes[("contact.created", "retry")] == 1
    assert rows(runtime.pool, "SELECT attempts FROM followup_triggers") == [(2,)]
    assert rows(runtime.pool, "SELECT count(*) FROM followup_enrollments") == [(0,)]
    assert sent(runtime, actors.RELEASE_NUDGE) == []


def test_a_bulk_chunk_nudges_the_release_service_once_per_project_after_its_commit(
    client: TestClient[Any], runtime: Runtime, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a bulk job of three contacts in a sequence whose first message is due at once
    sequence_id = published(client, message_step("Hello"))
    contact_ids = [new_contact(client) for _ in range(3)]
    with effects.transaction(runtime) as conn:
        job = msgspec.convert({"sequence_id": sequence_id, "contact_ids": contact_ids}, BulkCreate)
        bulk.create_job(conn, project.id, job, now=runtime.clock.now())
    seen = nudged_when_committed(runtime, monkeypatch)
    # When the bulk loop's domain function runs its chunk
    assert bulk.process_chunk(runtime.pool, runtime.clock, runtime=runtime) == 3
    # Then the release service is nudged once for the project, after the chunk committed
    assert [m["project_id"] for m in sent(runtime, actors.RELEASE_NUDGE)] == [str(project.id)]
    assert seen == [3]


# --- counts: registered by the domain function, counted once after the commit


def stopped_total(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "whatstig_followup_finished_total", {"status": "stopped", "reason": reason}
    )
    return value or 0.0


def test_a_stop_by_hand_is_counted_once_after_its_commit_and_not_when_refused(
    client: TestClient[Any],
) -> None:
    sequence_id = published(client, message_step("Tomorrow", delay_seconds=86_400))
    body = {"sequence_id": sequence_id, "contact_id": new_contact(client)}
    response = client.post("/v1/enrollments", json=body)
    assert response.status_code == 201, response.text
    enrollment_id = response.json()["id"]
    before = stopped_total("manual")
    # a stop by hand is counted once
    assert client.post(f"/v1/enrollments/{enrollment_id}/stop", json={}).status_code == 200
    assert stopped_total("manual") == before + 1
    # a second stop is refused (409): not counted
    assert client.post(f"/v1/enrollments/{enrollment_id}/stop", json={}).status_code == 409
    assert stopped_total("manual") == before + 1
