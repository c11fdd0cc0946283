"""Sequences: an editable draft, published as immutable versions that enrollments pin.

A step is a tagged union on ``kind``. This module validates a definition, stores drafts and publishes
them; what the release path does with each step lives with the release service.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from libs.common.errors import Conflict, InvalidInput, NotFound
from libs.common.sql import load_queries

QUERIES = load_queries("libs.common", "sequences.sql")

#: Most steps one sequence may have.
MAX_STEPS = 50


class _Def(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class MessageStep(_Def, tag="message", tag_field="kind"):
    """Send a text (with optional media) ``delay_seconds`` after the previous step or enrollment."""

    text: str
    delay_seconds: int = 0
    media_url: str | None = None
    media_kind: Literal["image", "video", "audio", "document"] | None = None


Step = MessageStep


class StopFlags(_Def):
    """What stops an enrollment; copied onto each enrollment when it is created."""

    reply: bool = True
    human_message: bool = True
    opt_out: bool = True
    lead_closed: bool = True
    conversation_resolved: bool = True


class Definition(_Def):
    steps: list[Step]
    reentry: Literal["never", "after_finished", "always"] = "never"
    stop_on: StopFlags = msgspec.field(default_factory=StopFlags)


class SequenceCreate(_Def):
    name: str
    definition: Definition


class Sequence(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    name: str
    status: str
    draft: dict[str, Any]
    current_version_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime


class Version(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    version: int
    definition: dict[str, Any]
    created_at: datetime


_decode_definition = msgspec.json.Decoder(Definition).decode


def validate_definition(definition: Definition) -> Definition:
    """The checks a definition must pass to be published; each error names the step and field."""
    if not definition.steps:
        raise InvalidInput("a sequence needs at least one step", field="definition.steps")
    if len(definition.steps) > MAX_STEPS:
        raise InvalidInput(f"a sequence has at most {MAX_STEPS} steps", field="definition.steps")
    for index, step in enumerate(definition.steps):
        where = f"definition.steps[{index}]"
        if step.delay_seconds < 0:
            raise InvalidInput("delay_seconds must not be negative", field=f"{where}.delay_seconds")
        if not step.text.strip():
            raise InvalidInput("text must not be empty", field=f"{where}.text")
    return definition


def parse_definition(stored: dict[str, Any]) -> Definition:
    return msgspec.convert(stored, Definition)


def create_sequence(conn: Connection[Any], project_id: uuid.UUID, data: SequenceCreate) -> Sequence:
    name = data.name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidInput("name must be 1 to 200 characters", field="name")
    params = {"project_id": project_id, "name": name, "draft": Jsonb(msgspec.to_builtins(data.definition))}
    with conn.cursor(row_factory=class_row(Sequence)) as cur:
        sequence = cur.execute(QUERIES["insert_sequence"], params).fetchone()
    assert sequence is not None
    return sequence


def get_sequence(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID) -> Sequence:
    with conn.cursor(row_factory=class_row(Sequence)) as cur:
        params = {"project_id": project_id, "id": sequence_id}
        sequence = cur.execute(QUERIES["get_sequence"], params).fetchone()
    if sequence is None:
        raise NotFound("sequence not found", field="sequence_id")
    return sequence


def publish_sequence(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID) -> Version:
    """Freeze the draft as the next immutable version and make it the one new enrollments pin."""
    params: dict[str, Any] = {"project_id": project_id, "id": sequence_id}
    row = conn.execute(QUERIES["lock_sequence"], params).fetchone()
    if row is None:
        raise NotFound("sequence not found", field="sequence_id")
    status, draft = row
    if status == "archived":
        raise Conflict("an archived sequence cannot be published", field="sequence_id")
    definition = validate_definition(parse_definition(draft))
    params = {
        "project_id": project_id,
        "sequence_id": sequence_id,
        "definition": Jsonb(msgspec.to_builtins(definition)),
        "step_count": len(definition.steps),
    }
    with conn.cursor(row_factory=class_row(Version)) as cur:
        version = cur.execute(QUERIES["insert_version"], params).fetchone()
    assert version is not None
    conn.execute(QUERIES["set_current_version"], {"id": sequence_id, "version_id": version.id})
    return version
