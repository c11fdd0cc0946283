"""Sequences: an editable draft, published as immutable versions that enrollments pin.

A step is a tagged union on ``kind`` (``message`` or ``ai``). Each step has its timing: a delay after the
previous step (or after enrollment), or an offset from the enrollment's anchor time (a reminder, for
example 2 hours before ``anchor_at``) with a grace period after which it is skipped as past due; and an
optional ``only_if``. A draft may be incomplete; publishing validates it and freezes it as a version.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import OrderedDict
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from psycopg import Connection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from libs.common import validation
from libs.common.errors import Conflict, InvalidInput, NotFound
from libs.common.sql import load_queries
from libs.common.templates import TemplateError, parse_template

QUERIES = load_queries("libs.common", "sequences.sql")

#: Most steps one sequence may have.
MAX_STEPS = 50
#: Longest wait a step may declare (a year).
MAX_DELAY_SECONDS = 366 * 86400

NonNegative = Annotated[int, msgspec.Meta(ge=0, le=MAX_DELAY_SECONDS)]
Offset = Annotated[int, msgspec.Meta(ge=-MAX_DELAY_SECONDS, le=MAX_DELAY_SECONDS)]

#: ``only_if`` conditions: the step is skipped unless every one holds at release.
OnlyIf = Literal["no_reply_since_previous_step", "no_reply_since_enrollment", "previous_not_read"]


class _Def(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class TemplateFallback(_Def, kw_only=True, tag="template", tag_field="kind"):
    """Send this template instead."""

    text: str


class SkipFallback(_Def, kw_only=True, tag="skip", tag_field="kind"):
    """Skip the step."""


class _Step(_Def, kw_only=True):
    delay_seconds: NonNegative = 0
    anchor_offset_seconds: Offset | None = None
    grace_seconds: NonNegative = 3600
    only_if: list[OnlyIf] = msgspec.field(default_factory=list)


class MessageStep(_Step, kw_only=True, tag="message", tag_field="kind"):
    """Send a text (a template), with optional media."""

    text: str
    media_url: str | None = None
    media_kind: Literal["image", "video", "audio", "document"] | None = None


class AiStep(_Step, kw_only=True, tag="ai", tag_field="kind"):
    """A message written by the model from ``instructions``; ``fallback`` when it cannot be used."""

    instructions: str
    fallback: TemplateFallback | SkipFallback


Step = MessageStep | AiStep


class StopFlags(_Def, kw_only=True):
    """What stops an enrollment; copied onto each enrollment when it is created."""

    reply: bool = True
    human_message: bool = True
    opt_out: bool = True
    lead_closed: bool = True
    conversation_resolved: bool = True


class Definition(_Def, kw_only=True):
    steps: list[Step] = msgspec.field(default_factory=list)
    #: never: a contact enters once; after_finished: again once the previous enrollment finished;
    #: always: a new enrollment replaces the live one.
    reentry: Literal["never", "after_finished", "always"] = "after_finished"
    stop_on: StopFlags = msgspec.field(default_factory=StopFlags)


class SequenceCreate(_Def, kw_only=True):
    name: str
    definition: Definition = msgspec.field(default_factory=Definition)


class SequenceUpdate(_Def, kw_only=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    definition: Definition | msgspec.UnsetType = msgspec.UNSET


class Sequence(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    name: str
    status: str
    draft: dict[str, Any]
    current_version_id: uuid.UUID | None
    current_version: int | None
    created_at: datetime
    updated_at: datetime


class Version(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    version: int
    definition: dict[str, Any]
    created_at: datetime


def _field_path(path: str) -> str:
    """A msgspec error path (``$.steps[0].kind``) in the API's dotted style (``steps.0.kind``)."""
    return re.sub(r"\[(\d+)\]", r".\1", path.removeprefix("$")).strip(".")


def decode_definition(raw: Any, field: str = "definition") -> Definition:
    """A definition from JSON-like data; a malformed one raises InvalidInput naming the field."""
    try:
        return msgspec.convert(raw, Definition)
    except msgspec.ValidationError as exc:
        message, _, path = str(exc).partition(" - at `")
        where = ".".join(part for part in (field, _field_path(path.rstrip("`"))) if part)
        raise InvalidInput(f"{where}: {message}", field=where) from None


def _steps_field(field: str) -> str:
    """Where a definition's steps are: ``definition.steps``, or ``steps`` for an inline (one-off) list."""
    return f"{field}.steps" if field else "steps"


def validate_definition(definition: Definition, field: str = "definition") -> Definition:
    """The checks a definition must pass to be published; each error names the step and field.

    Field paths are dotted (``definition.steps.0.text``); ``field=""`` validates an inline list of steps
    (a one-off follow-up), named ``steps.0.text``.
    """
    steps_field = _steps_field(field)
    if not definition.steps:
        raise InvalidInput("a sequence needs at least one step", field=steps_field)
    if len(definition.steps) > MAX_STEPS:
        raise InvalidInput(f"a sequence has at most {MAX_STEPS} steps", field=steps_field)
    for index, step in enumerate(definition.steps):
        where = f"{steps_field}.{index}"
        if step.anchor_offset_seconds is not None and step.delay_seconds:
            raise InvalidInput(
                "a step is timed either by delay_seconds or by anchor_offset_seconds, not both",
                field=f"{where}.anchor_offset_seconds",
            )
        if index == 0 and "no_reply_since_previous_step" in step.only_if:
            raise InvalidInput("the first step has no previous step", field=f"{where}.only_if")
        if index == 0 and "previous_not_read" in step.only_if:
            raise InvalidInput("the first step has no previous follow-up", field=f"{where}.only_if")
        if isinstance(step, MessageStep):
            _check_media(step, where)
        texts = {"text": step.text} if isinstance(step, MessageStep) else {"instructions": step.instructions}
        if isinstance(step, AiStep) and isinstance(step.fallback, TemplateFallback):
            texts["fallback.text"] = step.fallback.text
        for name, text in texts.items():
            if not text.strip():
                raise InvalidInput(f"{name} must not be empty", field=f"{where}.{name}")
            try:
                parse_template(text)
            except TemplateError as exc:
                raise InvalidInput(str(exc), field=f"{where}.{name}") from None
    return definition


def _check_media(step: MessageStep, where: str) -> None:
    """Media is an http(s) URL with its kind; a kind without a URL is a mistake, not a text message."""
    if step.media_url is None:
        if step.media_kind is not None:
            raise InvalidInput("media_kind needs a media_url", field=f"{where}.media_url")
        return
    try:
        url = urlsplit(step.media_url)
    except ValueError:  # an unbalanced IPv6 bracket, say
        url = urlsplit("")
    if url.scheme not in ("http", "https") or not url.netloc or any(c.isspace() for c in step.media_url):
        raise InvalidInput("media_url must be an http or https URL", field=f"{where}.media_url")
    if step.media_kind is None:
        raise InvalidInput(
            "media_kind (image, video, audio or document) is needed with a media_url",
            field=f"{where}.media_kind",
        )


def _storable(definition: Definition, field: str) -> Definition:
    """A definition PostgreSQL can store (no NUL character in any text), else InvalidInput naming it."""
    validation.json_value(msgspec.to_builtins(definition.steps), _steps_field(field))
    return definition


class _VersionCache:
    """Parsed definitions by version id: versions are immutable, so an entry never goes stale."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: OrderedDict[uuid.UUID, Definition] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, conn: Connection[Any], version_id: uuid.UUID) -> Definition:
        with self._lock:
            found = self._entries.get(version_id)
            if found is not None:
                self._entries.move_to_end(version_id)
                return found
        row = conn.execute(QUERIES["version_definition"], {"id": version_id}).fetchone()
        if row is None:
            raise NotFound("sequence version not found", field="version_id")
        definition = msgspec.convert(row[0], Definition)
        with self._lock:
            self._entries[version_id] = definition
            if len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return definition


_VERSIONS = _VersionCache()


def version_definition(conn: Connection[Any], version_id: uuid.UUID) -> Definition:
    """A pinned version's definition, parsed once per process."""
    return _VERSIONS.get(conn, version_id)


def step_due_at(step: Step, *, now: datetime, anchor_at: datetime | None) -> datetime | None:
    """When ``step`` is due if the previous step (or the enrollment) happened at ``now``.

    None for an anchor-timed step of an enrollment without an anchor: it is due now and will be skipped.
    """
    if step.anchor_offset_seconds is None:
        return now + timedelta(seconds=step.delay_seconds)
    if anchor_at is None:
        return None
    return anchor_at + timedelta(seconds=step.anchor_offset_seconds)


def _encode(definition: Definition) -> Jsonb:
    return Jsonb(msgspec.to_builtins(definition))


def _name(name: str) -> str:
    name = validation.text(name, "name").strip()
    if not 1 <= len(name) <= 200:
        raise InvalidInput("name must be 1 to 200 characters", field="name")
    return name


def create_sequence(conn: Connection[Any], project_id: uuid.UUID, data: SequenceCreate) -> Sequence:
    params = {
        "project_id": project_id,
        "name": _name(data.name),
        "draft": _encode(_storable(data.definition, "definition")),
    }
    with conn.cursor(row_factory=class_row(Sequence)) as cur:
        sequence = cur.execute(QUERIES["insert_sequence"], params).fetchone()
    assert sequence is not None
    return sequence


def update_sequence(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID, data: SequenceUpdate
) -> Sequence:
    """Edit the draft (name, definition); running enrollments keep the version they pinned."""
    status, _ = _lock(conn, project_id, sequence_id)
    if status == "archived":
        raise Conflict("an archived sequence cannot be edited", field="sequence_id")
    params = {
        "project_id": project_id,
        "id": sequence_id,
        "name": None if isinstance(data.name, msgspec.UnsetType) else _name(data.name),
        "draft": (
            None
            if isinstance(data.definition, msgspec.UnsetType)
            else _encode(_storable(data.definition, "definition"))
        ),
    }
    with conn.cursor(row_factory=class_row(Sequence)) as cur:
        sequence = cur.execute(QUERIES["update_sequence"], params).fetchone()
    assert sequence is not None
    return sequence


def get_sequence(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID) -> Sequence:
    with conn.cursor(row_factory=class_row(Sequence)) as cur:
        params = {"project_id": project_id, "id": sequence_id}
        sequence = cur.execute(QUERIES["get_sequence"], params).fetchone()
    if sequence is None:
        raise NotFound("sequence not found", field="sequence_id")
    return sequence


def list_sequences(
    conn: Connection[Any], project_id: uuid.UUID, *, limit: int, after: uuid.UUID | None, status: str | None
) -> list[Sequence]:
    params = {"project_id": project_id, "limit": limit, "after": after, "status": status}
    with conn.cursor(row_factory=class_row(Sequence)) as cur:
        return cur.execute(QUERIES["list_sequences"], params).fetchall()


def _lock(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID) -> tuple[str, dict[str, Any]]:
    row = conn.execute(QUERIES["lock_sequence"], {"project_id": project_id, "id": sequence_id}).fetchone()
    if row is None:
        raise NotFound("sequence not found", field="sequence_id")
    return row[0], row[1]


def publish_sequence(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID) -> Version:
    """Freeze the draft as the next immutable version and make it the one new enrollments pin."""
    status, draft = _lock(conn, project_id, sequence_id)
    if status == "archived":
        raise Conflict("an archived sequence cannot be published", field="sequence_id")
    version = _insert_version(conn, project_id, sequence_id, validate_definition(decode_definition(draft)))
    conn.execute(QUERIES["set_current_version"], {"id": sequence_id, "version_id": version.id})
    return version


def create_one_off_version(conn: Connection[Any], project_id: uuid.UUID, definition: Definition) -> Version:
    """An inline version with no sequence, for an enrollment that carries its own steps."""
    return _insert_version(conn, project_id, None, validate_definition(_storable(definition, ""), field=""))


def _insert_version(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID | None, definition: Definition
) -> Version:
    """Freeze a validated definition as a version (the sequence's next, or a one-off)."""
    params = {
        "project_id": project_id,
        "sequence_id": sequence_id,
        "definition": _encode(definition),
        "step_count": len(definition.steps),
    }
    with conn.cursor(row_factory=class_row(Version)) as cur:
        version = cur.execute(QUERIES["insert_version"], params).fetchone()
    assert version is not None
    return version


def list_versions(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID) -> list[Version]:
    get_sequence(conn, project_id, sequence_id)
    with conn.cursor(row_factory=class_row(Version)) as cur:
        params = {"project_id": project_id, "sequence_id": sequence_id}
        return cur.execute(QUERIES["list_versions"], params).fetchall()


#: Allowed status changes: action -> (statuses it applies to, resulting status).
TRANSITIONS = {
    "pause": ({"active"}, "paused"),
    "resume": ({"paused"}, "active"),
    "archive": ({"draft", "active", "paused"}, "archived"),
}


def change_sequence_status(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID, action: str, *, now: datetime
) -> Sequence:
    """Pause, resume or archive a sequence.

    A paused sequence pauses each of its enrollments when it next comes up for release; resuming
    reactivates the enrollments it paused. Archiving stops new enrollments; running ones carry on, so
    archiving a paused sequence reactivates the enrollments its pause paused (nothing could resume them
    afterwards: they would stay live forever, blocking re-entry and counting against the plan limit).
    """
    allowed, target = TRANSITIONS[action]
    status, _ = _lock(conn, project_id, sequence_id)
    if status not in allowed:
        raise Conflict(f"a {status} sequence cannot be {target}", field="sequence_id")
    conn.execute(QUERIES["set_status"], {"id": sequence_id, "status": target})
    if status == "paused":
        conn.execute(QUERIES["resume_paused_enrollments"], {"sequence_id": sequence_id, "now": now})
    return get_sequence(conn, project_id, sequence_id)
