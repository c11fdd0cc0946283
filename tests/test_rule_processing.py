"""How the triggers service works through its triggers, end to end through the API: failures retried
with backoff then given up, the outcome counters, rules running in position order, a trigger taken over
after its lease, and projects kept apart.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from litestar.testing import TestClient
from prometheus_client import REGISTRY

from libs.common.core.runtime import Runtime
from libs.common.followups.definition import StopFlags
from libs.common.rules.actions import AddLabel, AssignTeam
from libs.common.rules.triggers import BACKOFF_MIN, LEASE, MAX_ATTEMPTS, process_triggers
from tests.conftest import Project
from tests.factories import make_sequence, new_phone
from tests.helpers import rows, wait_until
from tests.rule_helpers import add_label, add_tag, create_rule, leaf, post_event, process
from tests.rule_trigger_helpers import (
    advance,
    conversation_of,
    counted,
    new_contact,
    new_conversation,
    notes,
    rule_messages,
    runs,
    tags_of,
    trigger_count,
    unprocessed,
)

# --- 6. failures -------------------------------------------------------------------------------------------


def trigger_row(runtime: Runtime, kind: str | None = None) -> dict[str, Any]:
    """The one trigger (of type ``kind``)."""
    with runtime.pool.connection() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        [row] = cur.execute(
            "SELECT attempts, next_attempt_at, processed_at, outcome, last_error FROM followup_triggers"
            " WHERE %s::text IS NULL OR type = %s",
            (kind, kind),
        ).fetchall()
    return row


def test_a_busy_conversation_retries_the_trigger_after_backoff_without_running_a_rule_twice(
    client: TestClient[Any], runtime: Runtime
) -> None:
    seen = create_rule(client, "lead.created", [add_tag("seen")])
    # the tag is added before the message fails: rolled back with the rule
    sender = create_rule(
        client, "lead.created", [add_tag("replied"), {"type": "send_message", "text": "We got your request"}]
    )
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    executed, retry = counted("lead.created", "executed"), counted("lead.created", "retry")

    with psycopg.connect(runtime.settings.database.url) as locker:
        # another transaction holds the contact's open conversation: queueing the message raises busy
        locker.execute("SELECT id FROM conversations WHERE id = %s FOR UPDATE", (conversation,))
        post_event(client, {"type": "lead.created", "contact_id": contact}, 201)
        first = runtime.clock.now()
        assert process(runtime) == 1
        row = trigger_row(runtime)
        assert (row["attempts"], row["processed_at"], row["outcome"]) == (1, None, None)
        assert row["next_attempt_at"] == first + BACKOFF_MIN
        assert "ConversationBusy" in row["last_error"] and sender in row["last_error"]
        assert runs(client, seen) == [("executed", None)]
        assert runs(client, sender) == []
        assert tags_of(client, contact) == {"seen"}

        advance(runtime, BACKOFF_MIN - timedelta(seconds=1))
        assert process(runtime) == 0  # not due yet
        advance(runtime, timedelta(seconds=1))
        assert process(runtime) == 1
        row = trigger_row(runtime)
        assert row["attempts"] == 2
        assert row["next_attempt_at"] == runtime.clock.now() + 2 * BACKOFF_MIN
        locker.rollback()

    advance(runtime, 2 * BACKOFF_MIN)
    assert process(runtime) == 1

    row = trigger_row(runtime)
    assert (row["attempts"], row["outcome"], row["last_error"]) == (2, "processed", None)
    assert row["processed_at"] == runtime.clock.now()
    assert runs(client, seen) == [("executed", None)]  # not run again on the retries
    assert runs(client, sender) == [("executed", None)]
    assert tags_of(client, contact) == {"seen", "replied"}
    [message] = rule_messages(runtime, contact)
    assert (str(message["conversation_id"]), message["body"]) == (conversation, "We got your request")
    assert counted("lead.created", "executed") - executed == 2
    assert counted("lead.created", "retry") - retry == 2
    assert unprocessed(runtime) == 0


def test_a_rule_that_keeps_failing_is_given_up_after_max_attempts(
    client: TestClient[Any], runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("the action broke")

    monkeypatch.setattr(AddLabel, "run", broken)
    ok = create_rule(client, "conversation.created", [add_tag("ok")])
    failing = create_rule(client, "conversation.created", [add_label("never")])
    contact = new_contact(client)
    before = {o: counted("conversation.created", o) for o in ("executed", "retry", "failed")}
    conversation = new_conversation(client, contact)

    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert process(runtime) == 1, attempt
        row = trigger_row(runtime)
        assert row["attempts"] == attempt
        assert "RuntimeError('the action broke')" in row["last_error"] and failing in row["last_error"]
        if attempt < MAX_ATTEMPTS:
            backoff = BACKOFF_MIN * 2 ** (attempt - 1)
            assert (row["outcome"], row["processed_at"]) == (None, None)
            assert row["next_attempt_at"] == runtime.clock.now() + backoff
            advance(runtime, backoff)

    assert (row["outcome"], row["processed_at"]) == ("failed", runtime.clock.now())
    advance(runtime, timedelta(days=1))
    assert process(runtime) == 0  # given up: never claimed again
    assert runs(client, ok) == [("executed", None)]
    assert runs(client, failing) == []
    assert tags_of(client, contact) == {"ok"}
    assert conversation_of(client, conversation)["labels"] == []
    after = {o: counted("conversation.created", o) - before[o] for o in before}
    assert after == {"executed": 1, "retry": MAX_ATTEMPTS - 1, "failed": 1}


def test_each_rule_outcome_is_counted_by_event_type(client: TestClient[Any], runtime: Runtime) -> None:
    executes = create_rule(client, "lead.created", [add_tag("lead")])
    rejected = create_rule(client, "lead.created", [add_label("no-conversation-to-label")])
    misses = create_rule(client, "lead.created", [add_tag("lost")], leaf("lead.status", "equal_to", "lost"))
    contact = new_contact(client)
    outcomes = ("executed", "rejected", "not_matched", "retry", "failed", "no_rule")
    before = {o: counted("lead.created", o) for o in outcomes}

    post_event(client, {"type": "lead.created", "contact_id": contact}, 201)
    assert process(runtime) == 1

    after = {o: counted("lead.created", o) - before[o] for o in outcomes}
    assert after == {"executed": 1, "rejected": 1, "not_matched": 1, "retry": 0, "failed": 0, "no_rule": 0}
    assert runs(client, executes) == [("executed", None)]
    assert runs(client, rejected) == [("rejected", "no_conversation")]
    assert runs(client, misses) == []


# --- 7. order ----------------------------------------------------------------------------------------------


def test_rules_on_one_event_run_in_position_order(client: TestClient[Any], runtime: Runtime) -> None:
    def labelled(name: str) -> list[dict[str, Any]]:
        return [add_label(name), {"type": "add_private_note", "text": name}]

    second = create_rule(client, "conversation.created", labelled("second"), position=5)
    first = create_rule(client, "conversation.created", labelled("first"), position=1)
    listed = client.get("/v1/rules", params={"event": "conversation.created"}).json()["items"]
    assert [rule["id"] for rule in listed] == [first, second]
    contact = new_contact(client)

    conversation = new_conversation(client, contact)
    assert process(runtime) == 1

    assert conversation_of(client, conversation)["labels"] == ["first", "second"]
    assert [n["text"] for n in notes(runtime, contact)] == ["first", "second"]
    [(count,)] = rows(runtime.pool, "SELECT count(*) FROM rule_runs")
    assert count == 2

    # reordered: the other runs first
    response = client.patch(f"/v1/rules/{second}", json={"position": 0})
    assert response.status_code == 200, response.text
    new_conversation(client, contact)
    assert process(runtime) == 1
    assert [n["text"] for n in notes(runtime, contact)] == ["first", "second", "second", "first"]
    assert runs(client, first) == runs(client, second) == [("executed", None)] * 2


# --- concurrency and isolation -----------------------------------------------------------------------------


def test_a_trigger_taken_over_after_its_lease_is_not_run_again_by_its_first_worker(
    client: TestClient[Any], runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's batch is slow (its first trigger waits on a lock) past the lease of its second trigger;
    another worker takes that one over, runs a rule, and fails on the next. The first worker must not run
    the taken-over trigger's rules again (nor ignore its backoff)."""

    def broken(*args: Any) -> None:
        raise RuntimeError("the action broke")

    monkeypatch.setattr(AssignTeam, "run", broken)
    create_rule(client, "conversation.created", [add_label("slow")])
    sender = create_rule(client, "lead.created", [{"type": "send_message", "text": "Hello once"}])
    create_rule(client, "lead.created", [{"type": "assign_team", "team": "sales"}])
    slow_contact, contact = new_contact(client), new_contact(client)

    with psycopg.connect(runtime.settings.database.url) as locker:
        slow_conversation = new_conversation(client, slow_contact)  # trigger 1
        post_event(client, {"type": "lead.created", "contact_id": contact}, 201)  # trigger 2
        locker.execute("SELECT id FROM conversations WHERE id = %s FOR UPDATE", (slow_conversation,))
        errors: list[BaseException] = []

        def first_worker() -> None:
            try:
                process_triggers(runtime.pool, runtime.clock)
            except BaseException as exc:  # reported by the test
                errors.append(exc)

        worker = threading.Thread(target=first_worker)
        worker.start()
        try:
            wait_until(
                lambda: rows(
                    runtime.pool,
                    "SELECT 1 FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'",
                ),
                what="the first worker waiting on the conversation",
            )
            advance(runtime, LEASE + timedelta(seconds=1))
            # the second worker takes over the trigger whose lease ran out: it sends, then fails
            assert process_triggers(runtime.pool, runtime.clock).triggers == 1
            taken_over = trigger_row(runtime, "lead.created")
            assert taken_over["attempts"] == 1
        finally:
            locker.rollback()
            worker.join(30)
    assert not worker.is_alive() and errors == []

    assert len(rule_messages(runtime, contact)) == 1
    assert runs(client, sender) == [("executed", None)]
    after = trigger_row(runtime, "lead.created")
    assert (after["attempts"], after["next_attempt_at"]) == (1, taken_over["next_attempt_at"])


def test_rules_fire_only_for_their_own_projects_events(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    rule = create_rule(client, "contact.created", [add_tag("ours")])

    response = client.post("/v1/contacts", json={"phone": new_phone()}, headers=other_project.headers)
    assert response.status_code == 201, response.text
    theirs = response.json()["id"]
    assert trigger_count(runtime) == 0
    ours = new_contact(client)
    assert process(runtime) == 1

    assert runs(client, rule) == [("executed", None)]
    assert tags_of(client, ours) == {"ours"}
    [(tags,)] = rows(runtime.pool, "SELECT tags FROM contacts WHERE id = %s", theirs)
    assert tags == []


def test_a_rule_that_resolves_the_conversation_stops_follow_ups_like_an_agent_would(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    """change_status resolved runs the conversation-resolved stop path (and counts it once committed)."""
    rule = create_rule(
        client,
        "message.created",
        [{"type": "change_status", "status": "resolved"}],
        {"all": [leaf("message.content", "contains", "thanks, solved")]},
    )
    contact = new_contact(client)
    conversation = new_conversation(client, contact)
    sequence = make_sequence(runtime.pool, project.id, stop_on=StopFlags(reply=False))
    enrolled = client.post("/v1/enrollments", json={"sequence_id": str(sequence), "contact_id": contact})
    assert enrolled.status_code == 201, enrolled.text
    before = (
        REGISTRY.get_sample_value(
            "whatstig_followup_finished_total", {"status": "stopped", "reason": "conversation_resolved"}
        )
        or 0.0
    )
    post_event(
        client,
        {
            "type": "message.inbound",
            "provider_message_id": "wamid.solved",
            "contact_id": contact,
            "conversation_id": conversation,
            "body": "Thanks, solved!",
        },
        201,
    )
    assert process(runtime) == 1
    assert runs(client, rule) == [("executed", None)]
    assert conversation_of(client, conversation)["status"] == "resolved"
    enrollment = client.get(f"/v1/enrollments/{enrolled.json()['id']}").json()["enrollment"]
    assert (enrollment["status"], enrollment["reason"]) == ("stopped", "conversation_resolved")
    after = REGISTRY.get_sample_value(
        "whatstig_followup_finished_total", {"status": "stopped", "reason": "conversation_resolved"}
    )
    assert after == before + 1
