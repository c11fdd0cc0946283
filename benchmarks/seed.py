"""Bulk seeding for benchmarks and load tests: many due enrollments in a few statements."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
from psycopg import Connection

from libs.common.followups.definition import Definition, MessageStep
from libs.common.followups.project_settings import ProjectSettings, put_settings
from libs.common.followups.sequences import SequenceCreate, create_sequence, publish_sequence
from libs.common.platform.projects import create_project


def seed_project(
    conn: Connection[Any], *, text: str = "Hello {{contact.name}}"
) -> tuple[uuid.UUID, uuid.UUID]:
    """A project with a published one-step sequence; returns (project_id, sequence_id)."""
    project = create_project(conn, "bench")
    sequence = create_sequence(
        conn,
        project.project_id,
        SequenceCreate(name="bench", definition=Definition(steps=[MessageStep(text=text)])),
    )
    publish_sequence(conn, project.project_id, sequence.id)
    return project.project_id, sequence.id


def seed_due_enrollments(
    conn: Connection[Any],
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    count: int,
    *,
    due_at: datetime,
    with_conversations: bool = True,
) -> None:
    """``count`` contacts (each with an open conversation), each enrolled in the sequence, due at
    ``due_at``."""
    params = {"project_id": project_id, "sequence_id": sequence_id, "count": count, "due_at": due_at}
    conn.execute(
        """
        INSERT INTO contacts (project_id, phone, name)
        SELECT %(project_id)s, '+1' || lpad((2000000000 + g)::text, 10, '0'), 'Contact ' || g
        FROM generate_series(1, %(count)s) AS g
        """,
        params,
    )
    if with_conversations:
        conn.execute(
            "INSERT INTO conversations (project_id, contact_id) SELECT project_id, id FROM contacts"
            " WHERE project_id = %(project_id)s",
            params,
        )
    conn.execute(
        """
        INSERT INTO followup_enrollments (project_id, sequence_id, version_id, contact_id, next_run_at,
                                          step_due_at, enrolled_at, updated_at)
        SELECT %(project_id)s, s.id, s.current_version_id, c.id, %(due_at)s, %(due_at)s, %(due_at)s,
               %(due_at)s
        FROM contacts c, followup_sequences s
        WHERE c.project_id = %(project_id)s AND s.id = %(sequence_id)s
        """,
        params,
    )


def seed_history(conn: Connection[Any], project_id: uuid.UUID, *, before: datetime) -> None:
    """Each contact of the project wrote once and was answered once, in its conversation, two days
    ``before``: the messages table holds a running system's history (and its statistics say so), not
    nothing."""
    params = {"project_id": project_id, "at": before - timedelta(days=2)}
    conn.execute("ANALYZE contacts, conversations")  # the join below is planned on the rows just seeded
    conn.execute(
        """
        INSERT INTO messages (project_id, contact_id, conversation_id, direction, status, source, body,
                              provider_message_id, created_at, status_changed_at)
        SELECT c.project_id, c.id, v.id, d.direction, d.status, d.source, 'earlier',
               d.direction || '-' || c.id, %(at)s + d.later, %(at)s + d.later
        FROM contacts c
        LEFT JOIN conversations v ON v.project_id = c.project_id AND v.contact_id = c.id
        CROSS JOIN (VALUES ('inbound', 'RECEIVED', 'contact', interval '0'),
                           ('outbound', 'READ', 'human', interval '1 minute'))
                   AS d(direction, status, source, later)
        WHERE c.project_id = %(project_id)s
        """,
        params,
    )
    conn.execute("UPDATE contacts SET last_inbound_at = %(at)s WHERE project_id = %(project_id)s", params)


def with_numbers(conn: Connection[Any], project_id: uuid.UUID, count: int) -> None:
    """``count`` connected numbers for the project, its contacts' conversations spread over them."""
    conn.execute(
        """
        INSERT INTO numbers (project_id, phone, status, is_default)
        SELECT %(project_id)s, '+1999' || lpad(g::text, 7, '0'), 'connected', g = 1
        FROM generate_series(1, %(count)s) AS g
        """,
        {"project_id": project_id, "count": count},
    )
    conn.execute(
        """
        UPDATE conversations v SET number_id = n.id
        FROM (SELECT id, row_number() OVER (ORDER BY id) - 1 AS i FROM numbers
              WHERE project_id = %(project_id)s) n
        WHERE v.project_id = %(project_id)s
          AND n.i = abs(hashtext(v.id::text)) %% %(count)s
        """,
        {"project_id": project_id, "count": count},
    )


#: Tables a fresh seed empties.
_SEEDED = (
    "projects, contacts, conversations, messages, followup_enrollments, outbox, activities, numbers,"
    " followup_settings, followup_instance_pacing, usage_counters"
)


def reset(url: str) -> None:
    """Empty what a seed fills, then vacuum and analyse: each run starts from the same tables."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {_SEEDED} CASCADE")
        conn.execute("VACUUM ANALYZE")


#: Sending numbers of the constrained and paced runs.
NUMBERS = 20


def seed_due(url: str, count: int, settings: dict[str, Any] | None = None) -> None:
    """A fresh seed (after :func:`reset`) of ``count`` due enrollments of one project, with its message
    history, analysed; with ``settings``, those follow-up settings and NUMBERS connected numbers
    that the contacts' conversations are spread over."""
    with psycopg.connect(url) as conn:
        project_id, sequence_id = seed_project(conn)
        seed_due_enrollments(conn, project_id, sequence_id, count, due_at=datetime.now(UTC))
        seed_history(conn, project_id, before=datetime.now(UTC))
        if settings is not None:
            with_numbers(conn, project_id, NUMBERS)
            put_settings(
                conn,
                project_id,
                msgspec.convert(settings, ProjectSettings),
                now=datetime.now(UTC),
                ai_token_cap=None,
            )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
