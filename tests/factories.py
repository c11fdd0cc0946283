"""Small builders for domain rows, through the domain functions themselves."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from libs.common.core.clock import Clock
from libs.common.followups.definition import Definition, MessageStep, Step
from libs.common.followups.enrollments import EnrollRequest, enroll
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.followups.transitions import Enrollment
from libs.common.platform import conversations, messages
from libs.common.platform.contacts import ContactCreate, create_contact

_counter = iter(range(10**9))


def new_phone() -> str:
    return f"+1555{next(_counter):07d}"


def make_contact(pool: ConnectionPool, project_id: uuid.UUID, **fields: Any) -> uuid.UUID:
    with pool.connection() as conn:
        return create_contact(
            conn, project_id, ContactCreate(phone=fields.pop("phone", new_phone()), **fields)
        ).id


def make_sequence(pool: ConnectionPool, project_id: uuid.UUID, *steps: Step, **options: Any) -> uuid.UUID:
    """A published sequence with ``steps`` (one immediate message step by default)."""
    steps = steps or (MessageStep(text="Hello"),)
    with pool.connection() as conn:
        sequence = create_sequence(
            conn,
            project_id,
            SequenceCreate(
                name=f"seq {uuid.uuid4().hex[:6]}", definition=Definition(steps=list(steps), **options)
            ),
        )
        publish_sequence(conn, project_id, sequence.id)
    return sequence.id


def make_enrollment(
    pool: ConnectionPool,
    clock: Clock,
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    contact_id: uuid.UUID,
    **fields: Any,
) -> Enrollment:
    with pool.connection() as conn:
        enrollment, _ = enroll(
            conn,
            project_id,
            EnrollRequest(sequence_id=sequence_id, contact_id=contact_id, **fields),
            now=clock.now(),
        )
    return enrollment


def record_reply(
    pool: ConnectionPool, project_id: uuid.UUID, contact_id: uuid.UUID, at: datetime, body: str = "a reply"
) -> uuid.UUID:
    """The contact writes in at ``at``, recorded as the messaging platform records it (its message, in the
    contact's open conversation or a new one), without the stop path the ingress would run: what the
    release path's own reply checks must catch. Returns the message id."""
    with pool.connection() as conn:
        conversation_id = conversations.open_conversation_id(conn, project_id, contact_id)
        if conversation_id is None:
            conversation_id = conversations.create_conversation(conn, project_id, contact_id, now=at)[0].id
        return messages.record_inbound_message(
            conn,
            project_id,
            contact_id,
            conversation_id,
            provider_message_id=f"reply-{uuid.uuid4()}",
            body=body,
            media_url=None,
            media_kind=None,
            now=at,
        ).message_id
