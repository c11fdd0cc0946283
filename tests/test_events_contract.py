"""Every domain event, its struct and its documentation agree.

A broad scenario runs every path that writes an event; then each outbox row it left is decoded with the
struct of its type (unknown or missing fields fail), its aggregate is checked, and docs/events.md is held
against the structs: every type has a section naming each of its fields.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from psycopg_pool import ConnectionPool

from libs.common.contracts.events import EVENT_TYPES, Event
from libs.common.contracts.platform_events import ContactErased, HumanMessage, InboundMessage, MessageStatus
from libs.common.core.clock import ManualClock
from libs.common.core.settings import FollowupSettings
from libs.common.followups import release_step
from libs.common.followups.definition import Exit, Goal, MessageStep
from libs.common.followups.goals import CRITERIA
from libs.common.ingress import apply_event
from libs.common.ingress.contact_changes import change_tags
from libs.common.platform.send_lane import ClaimRequest, claim_messages
from libs.common.rules import bulk
from services.release.release import release_batch
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence

DOCS = Path(__file__).resolve().parent.parent / "docs" / "events.md"


def _outbox(pool: ConnectionPool) -> list[tuple[str, str, uuid.UUID, dict[str, Any]]]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT type, aggregate_type, aggregate_id, data FROM outbox ORDER BY id"
        ).fetchall()


def _event(pool: ConnectionPool, project: Project, clock: ManualClock, event: Any) -> None:
    with pool.connection() as conn:
        apply_event(conn, project.id, event, now=clock.now())


def _run_every_event_path(
    pool: ConnectionPool, clock: ManualClock, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = FollowupSettings()
    # a two-step sequence: the first step queued, the second skipped (a missing variable), then completed
    two_steps = make_sequence(
        pool,
        project.id,
        MessageStep(text="Hello"),
        MessageStep(text="Hi {{ vars.missing }}", delay_seconds=60),
    )
    completer = make_contact(pool, project.id)
    make_enrollment(pool, clock, project.id, two_steps, completer)
    release_batch(pool, clock, settings)
    clock.advance(timedelta(minutes=2))
    release_batch(pool, clock, settings)

    # the send lane claims it and reports it sent, delivered, read
    with pool.connection() as conn:
        (claimed,) = claim_messages(conn, project.id, ClaimRequest(limit=10), now=clock.now())
    for status in ("SENT", "DELIVERED", "READ"):
        _event(pool, project, clock, MessageStatus(status=status, message_id=claimed.id))

    # a follow-up is queued, claimed and reported FAILED by the send lane
    one_step = make_sequence(pool, project.id, MessageStep(text="Hello again"))
    failing = make_contact(pool, project.id)
    make_enrollment(pool, clock, project.id, one_step, failing)
    release_batch(pool, clock, settings)
    with pool.connection() as conn:
        (lost,) = claim_messages(conn, project.id, ClaimRequest(limit=10), now=clock.now())
    _event(pool, project, clock, MessageStatus(status="FAILED", message_id=lost.id, error="undeliverable"))

    # a queued follow-up is cancelled by the contact's reply, which stops the enrollment
    two_more = make_sequence(
        pool, project.id, MessageStep(text="First"), MessageStep(text="Second", delay_seconds=3600)
    )
    replier = make_contact(pool, project.id)
    make_enrollment(pool, clock, project.id, two_more, replier)
    release_batch(pool, clock, settings)
    _event(pool, project, clock, InboundMessage(contact_id=replier, provider_message_id="reply-1"))
    with pool.connection() as conn:
        conversation = conn.execute(
            "SELECT id FROM conversations WHERE contact_id = %s", (replier,)
        ).fetchone()
    assert conversation is not None
    _event(pool, project, clock, HumanMessage(conversation_id=conversation[0], body="An agent answers"))

    # an enrollment whose release keeps failing is failed for good
    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(release_step, "message_to_queue", explode)
    poisoned = make_contact(pool, project.id)
    make_enrollment(pool, clock, project.id, one_step, poisoned)
    release_batch(pool, clock, msgspec.structs.replace(settings, max_failures=1))
    monkeypatch.undo()

    # a bulk enrollment of two contacts, a chunk at a time: progress, then completed
    with pool.connection() as conn:
        bulk.create_job(
            conn,
            project.id,
            bulk.BulkCreate(
                sequence_id=one_step, contact_ids=[make_contact(pool, project.id) for _ in range(2)]
            ),
            now=clock.now(),
        )
    while bulk.process_chunk(pool, clock, chunk=1):
        pass

    # a goal met converts one enrollment, an exit met exits another
    criteria = make_sequence(
        pool,
        project.id,
        MessageStep(text="Until you buy"),
        MessageStep(text="Still there?", delay_seconds=3600),
        goals=[Goal(name="bought", event="contact.tag_added", conditions=_tagged("customer"))],
        exits=[Exit(name="gone", event="contact.tag_added", conditions=_tagged("gone"))],
    )
    CRITERIA.invalidate(project.id)  # the publication's after-commit effect: make_sequence runs none
    for tag in ("customer", "gone"):
        contact_id = make_contact(pool, project.id)
        make_enrollment(pool, clock, project.id, criteria, contact_id)
        with pool.connection() as conn:
            change_tags(conn, project.id, contact_id, add=[tag], now=clock.now())

    _event(pool, project, clock, ContactErased(contact_id=completer))


def _tagged(tag: str) -> dict[str, Any]:
    return {"attribute": "event.tags_added", "operator": "contains", "value": tag}


def test_every_outbox_row_decodes_with_the_struct_of_its_type(
    pool: ConnectionPool, clock: ManualClock, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_every_event_path(pool, clock, project, monkeypatch)
    rows = _outbox(pool)
    # the scenario reached every event type (so this test cannot pass by writing few of them)
    assert {type_ for type_, *_ in rows} == set(EVENT_TYPES)
    # and wrote each once
    assert len({(type_, aggregate_id, str(data)) for type_, _, aggregate_id, data in rows}) == len(rows)
    for type_, aggregate_type, aggregate_id, data in rows:
        struct = EVENT_TYPES[type_]
        event = msgspec.convert(data, struct)  # unknown or missing fields raise
        assert aggregate_type == struct.aggregate_type, type_
        assert aggregate_id == event.aggregate_id, type_
        # and nothing is lost on the way: the struct encodes back to the row's data
        assert msgspec.to_builtins(event) == data, type_


def _doc_sections() -> dict[str, str]:
    """docs/events.md's `### ...` sections by each event type their heading names."""
    sections: dict[str, str] = {}
    for block in re.split(r"^### ", DOCS.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
        heading, _, body = block.partition("\n")
        for type_ in re.findall(r"`([a-z_]+\.[a-z_]+)`", heading):
            sections[type_] = sections.get(type_, "") + body
    return sections


@pytest.mark.parametrize("struct", list(EVENT_TYPES.values()), ids=list(EVENT_TYPES))
def test_the_docs_describe_each_event_type_with_every_field(struct: type[Event]) -> None:
    sections = _doc_sections()
    assert struct.type in sections, f"docs/events.md has no section for {struct.type}"
    missing = [f for f in struct.__struct_fields__ if f"`{f}`" not in sections[struct.type]]
    assert not missing, f"docs/events.md does not describe {missing} of {struct.type}"


def test_the_docs_name_no_event_type_the_engine_does_not_write() -> None:
    assert set(_doc_sections()) <= set(EVENT_TYPES)
