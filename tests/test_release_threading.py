"""The conversation a released message threads into, and the locks on the way: the contact's open
conversation, the enrollment's own while open, never a resolved one; a locked conversation or contact defers
the step busy without waiting; plan limits never block the release.

Domain-level scenarios of the release path (seed 000, "Release (one step, one transaction)"), driven on
the controllable clock: what each release leaves behind in messages, step runs, the enrollment, the outbox
and the metrics.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from psycopg import Connection
from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.followups.definition import MessageStep
from libs.common.followups.enrollments import EnrollRequest, enroll
from libs.common.followups.release_step import Released
from services.release.release import release_one
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment
from tests.helpers import rows
from tests.release_helpers import (
    DAY,
    HOUR,
    SETTINGS,
    STEPS,
    Metrics,
    bodies,
    count,
    events,
    release,
    release_all,
    sequence,
    state,
)


def release_without_waiting(
    pool: ConnectionPool, clock: ManualClock, seconds: float = 5.0
) -> Released | None:
    """release_one in a thread: fails if it is still waiting (for a lock) after ``seconds``."""
    box: list[Released | None] = []
    thread = threading.Thread(target=lambda: box.append(release_one(pool, clock, SETTINGS)), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the release waited for a lock"
    assert time.monotonic() - started < 2, "the release took too long: it waited"
    return box[0]


def conversation(
    pool: ConnectionPool, project_id: uuid.UUID, contact_id: uuid.UUID, *, status: str, created_at: datetime
) -> uuid.UUID:
    with pool.connection() as conn:
        row = conn.execute(
            "INSERT INTO conversations (project_id, contact_id, status, created_at)"
            " VALUES (%s, %s, %s, %s) RETURNING id",
            (project_id, contact_id, status, created_at),
        ).fetchone()
    assert row is not None
    conversation_id: uuid.UUID = row[0]
    return conversation_id


@contextmanager
def locked_conversation(pool: ConnectionPool, conversation_id: uuid.UUID) -> Iterator[Connection[Any]]:
    """Another transaction (an inbox reply, say) holds the conversation row while the block runs."""
    with pool.connection() as locker:
        locker.execute("SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,))
        yield locker


# --- conversation threading ------------------------------------------------------------------------------


def test_messages_thread_into_the_contacts_open_conversation(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"), MessageStep(text="two", delay_seconds=60))
    contact = make_contact(pool, project.id)
    other = make_contact(pool, project.id)
    older = conversation(pool, project.id, contact, status="pending", created_at=clock.now() - DAY)
    newest = conversation(pool, project.id, contact, status="open", created_at=clock.now() - HOUR)
    conversation(pool, project.id, other, status="open", created_at=clock.now())
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    assert release(pool, clock).action == "queue"
    clock.advance(timedelta(seconds=60))
    assert release(pool, clock).action == "queue"

    threaded = rows(
        pool, "SELECT DISTINCT conversation_id FROM messages WHERE followup_enrollment_id = %s", enrollment.id
    )
    assert threaded == [(newest,)]
    assert older != newest
    assert count(pool, "conversations") == 3
    last = rows(
        pool, "SELECT m.body FROM conversations c JOIN messages m ON m.id = c.last_outgoing_message_id"
    )
    assert last == [("two",)]


def test_the_enrollments_own_conversation_is_preferred_while_open(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    own = conversation(pool, project.id, contact, status="open", created_at=clock.now() - DAY)
    conversation(pool, project.id, contact, status="open", created_at=clock.now() - HOUR)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact, conversation_id=own)
    assert release(pool, clock).action == "queue"
    assert rows(
        pool, "SELECT conversation_id FROM messages WHERE followup_enrollment_id = %s", enrollment.id
    ) == [(own,)]


def test_a_resolved_conversation_is_not_reused(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    resolved = conversation(pool, project.id, contact, status="resolved", created_at=clock.now() - HOUR)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact, conversation_id=resolved)
    assert release(pool, clock).action == "queue"
    threaded = rows(
        pool, "SELECT conversation_id FROM messages WHERE followup_enrollment_id = %s", enrollment.id
    )
    assert len(threaded) == 1 and threaded[0][0] != resolved
    opened = rows(
        pool, "SELECT status, contact_id, created_at FROM conversations WHERE id = %s", threaded[0][0]
    )
    assert opened == [("open", contact, clock.now())]
    assert rows(pool, "SELECT status FROM conversations WHERE id = %s", resolved) == [("resolved",)]


@pytest.mark.parametrize("another_open", [False, True])
def test_a_conversation_locked_by_another_transaction_defers_busy_without_waiting(
    pool: ConnectionPool, clock: ManualClock, project: Project, another_open: bool
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    if another_open:
        # an older open conversation must not receive the message just because the newest is busy
        conversation(pool, project.id, contact, status="open", created_at=clock.now() - DAY)
    target = conversation(pool, project.id, contact, status="open", created_at=clock.now() - HOUR)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    metrics = Metrics((STEPS, {"action": "defer", "outcome": "busy"}))

    with locked_conversation(pool, target):
        result = release_without_waiting(pool, clock)
        assert result is not None and (result.action, result.reason) == ("defer", "busy")
    assert state(pool, enrollment.id) == (
        "active",
        None,
        0,
        clock.now() + timedelta(seconds=SETTINGS.busy_retry_seconds),
    )
    assert count(pool, "messages") == 0
    assert count(pool, "followup_step_runs") == 0
    assert count(pool, "activities") == 0
    assert events(pool) == []
    assert metrics.delta(STEPS, action="defer", outcome="busy") == 1

    # once the other transaction is done, the retry threads into that conversation
    assert release_all(pool, clock) == 0
    clock.advance(timedelta(seconds=SETTINGS.busy_retry_seconds))
    assert release(pool, clock).action == "queue"
    assert rows(pool, "SELECT conversation_id FROM messages") == [(target,)]


def test_the_enrollments_conversation_locked_defers_busy_rather_than_threading_elsewhere(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    own = conversation(pool, project.id, contact, status="open", created_at=clock.now() - DAY)
    conversation(pool, project.id, contact, status="open", created_at=clock.now() - HOUR)
    make_enrollment(pool, clock, project.id, seq, contact, conversation_id=own)
    with locked_conversation(pool, own):
        result = release_without_waiting(pool, clock)
        assert result is not None and (result.action, result.reason) == ("defer", "busy")
    assert count(pool, "messages") == 0
    clock.advance(timedelta(seconds=SETTINGS.busy_retry_seconds))
    assert release(pool, clock).action == "queue"
    assert rows(pool, "SELECT conversation_id FROM messages") == [(own,)]


def test_a_locked_contact_defers_busy_without_waiting(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    contact = make_contact(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, seq, contact)
    with pool.connection() as locker:
        # a stop path (inbound message, opt-out) updates the contact
        locker.execute("UPDATE contacts SET name = 'Locked' WHERE id = %s", (contact,))
        result = release_without_waiting(pool, clock)
        assert result is not None and (result.action, result.reason) == ("defer", "busy")
    assert count(pool, "messages") == 0
    assert state(pool, enrollment.id)[:3] == ("active", None, 0)


def test_an_enrollment_counting_a_plan_limit_does_not_block_the_release(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    # an enrollment in a plan-limited project holds the project row while it counts live enrollments;
    # the rows a release inserts reference the project, and their foreign key checks must not wait for it
    seq = sequence(pool, project.id, MessageStep(text="one"))
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    with pool.connection() as enrolling:
        enrolling.execute("UPDATE projects SET max_active_enrollments = 100 WHERE id = %s", (project.id,))
    with pool.connection() as enrolling:
        other = make_contact(pool, project.id)
        enroll(enrolling, project.id, EnrollRequest(sequence_id=seq, contact_id=other), now=clock.now())
        result = release_without_waiting(pool, clock)
        assert result is not None and result.action == "queue"
    assert bodies(pool, enrollment.id) == ["one"]


def test_a_plan_change_in_flight_does_not_block_the_release(
    pool: ConnectionPool, clock: ManualClock, project: Project
) -> None:
    seq = sequence(pool, project.id, MessageStep(text="one"))
    enrollment = make_enrollment(pool, clock, project.id, seq, make_contact(pool, project.id))
    with pool.connection() as other:
        # an ordinary update of the project (not its key) does not conflict with the release
        other.execute("UPDATE projects SET name = 'renamed' WHERE id = %s", (project.id,))
        result = release_without_waiting(pool, clock)
        assert result is not None and result.action == "queue"
    assert bodies(pool, enrollment.id) == ["one"]
