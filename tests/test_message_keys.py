"""A message's keys (migration 0034): its project is the one its contact's key names, and what is deleted
above a message reaches it through that key."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import Connection
from psycopg_pool import ConnectionPool

from tests.conftest import Project
from tests.factories import make_contact


def _message(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, **columns: Any
) -> uuid.UUID:
    names = ", ".join(["project_id", "contact_id", "direction", "status", "source", *columns])
    values = ", ".join(["%s"] * (5 + len(columns)))
    row = conn.execute(
        f"INSERT INTO messages ({names}) VALUES ({values}) RETURNING id",
        (project_id, contact_id, "outbound", "QUEUED", "api", *columns.values()),
    ).fetchone()
    assert row is not None
    made: uuid.UUID = row[0]
    return made


def _messages(conn: Connection[Any], project_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, conversation_id FROM messages WHERE project_id = %s ORDER BY id", (project_id,)
    ).fetchall()


def test_a_message_of_another_projects_contact_is_refused(
    pool: ConnectionPool, project: Project, other_project: Project
) -> None:
    theirs = make_contact(pool, other_project.id)
    with pool.connection() as conn, pytest.raises(psycopg.errors.ForeignKeyViolation):
        _message(conn, project.id, theirs)
    with pool.connection() as conn, pytest.raises(psycopg.errors.ForeignKeyViolation):
        _message(conn, uuid.uuid4(), theirs)  # a project that does not exist


def test_deleting_a_project_deletes_its_messages_and_no_one_elses(
    pool: ConnectionPool, project: Project, other_project: Project
) -> None:
    with pool.connection() as conn:
        mine = _message(conn, project.id, make_contact(pool, project.id))
        conn.execute(
            "INSERT INTO message_status_events (project_id, message_id, status, occurred_at)"
            " VALUES (%s, %s, 'QUEUED', now())",
            (project.id, mine),
        )
        theirs = _message(conn, other_project.id, make_contact(pool, other_project.id))
    with pool.connection() as conn:
        conn.execute("DELETE FROM projects WHERE id = %s", (project.id,))
    with pool.connection() as conn:
        assert _messages(conn, project.id) == []
        assert conn.execute(
            "SELECT count(*) FROM message_status_events WHERE message_id = %s", (mine,)
        ).fetchone() == (0,)
        assert _messages(conn, other_project.id) == [(theirs, None)]


def test_a_deleted_conversation_leaves_its_messages_and_a_deleted_contact_takes_them(
    pool: ConnectionPool, project: Project
) -> None:
    contact = make_contact(pool, project.id)
    with pool.connection() as conn:
        conversation = conn.execute(
            "INSERT INTO conversations (project_id, contact_id) VALUES (%s, %s) RETURNING id",
            (project.id, contact),
        ).fetchone()
        assert conversation is not None
        kept = _message(conn, project.id, contact, conversation_id=conversation[0])
    with pool.connection() as conn:
        conn.execute(
            "DELETE FROM conversations WHERE project_id = %s AND id = %s", (project.id, conversation[0])
        )
        assert _messages(conn, project.id) == [(kept, None)]
    with pool.connection() as conn:
        conn.execute("DELETE FROM contacts WHERE project_id = %s AND id = %s", (project.id, contact))
        assert _messages(conn, project.id) == []
