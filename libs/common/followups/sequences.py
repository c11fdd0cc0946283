"""Sequences: an editable draft, published as immutable versions that enrollments pin.

A draft may be incomplete; publishing validates it (:mod:`libs.common.followups.definition`) and freezes
it as a version. Versions are immutable, so a parsed definition is cached per process by version id.
"""

from __future__ import annotations

import threading
import uuid
from datetime import datetime
from typing import Any, Literal, TypeVar

import msgspec
from psycopg import Connection
from psycopg.rows import BaseRowFactory, class_row, kwargs_row
from psycopg.types.json import Jsonb

from libs.common.contracts.limits import Name
from libs.common.core import validation
from libs.common.core.effects import Invalidate, after_commit
from libs.common.core.errors import Conflict, NotFound, Refusals
from libs.common.core.sql import load_queries
from libs.common.followups import transitions
from libs.common.followups.definition import (
    Definition,
    DefinitionWarning,
    SplitStep,
    decode_definition,
    placeholder_warnings,
    storable,
    validate_definition,
)
from libs.common.platform.numbers import get_number

QUERIES = load_queries("libs.common.followups", "sequences.sql")

#: What publishing a version with goals or exits invalidates: each process's events that the project's goals
#: and exits are about (:mod:`~libs.common.followups.goals`), published after the commit.
CRITERIA_INVALIDATION_KIND = "sequence_criteria"

_Row = TypeVar("_Row", "Sequence", "Version")


class SequenceCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name
    definition: Definition = msgspec.field(default_factory=Definition)


class SequenceUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name | msgspec.UnsetType = msgspec.UNSET
    definition: Definition | msgspec.UnsetType = msgspec.UNSET


#: A sequence's status: a draft until published, then active, paused or archived.
SequenceStatus = Literal["draft", "active", "paused", "archived"]


class Sequence(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    name: str
    status: SequenceStatus
    #: The definition being edited (publishing freezes it as a version).
    draft: Definition
    current_version_id: uuid.UUID | None
    current_version: int | None
    created_at: datetime
    updated_at: datetime


class Version(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    version: int
    definition: Definition
    created_at: datetime


class Published(Version, kw_only=True, frozen=True):
    """A version just published, with what its definition may not do as meant."""

    #: Each placeholder without a fallback (the step is skipped for an enrollment that lacks it).
    warnings: list[DefinitionWarning] = msgspec.field(default_factory=list)


def with_warnings(version: Version) -> Published:
    """``version`` with its definition's warnings (:func:`placeholder_warnings`)."""
    warnings = placeholder_warnings(decode_definition(version.definition))
    return Published(**msgspec.structs.asdict(version), warnings=warnings)


class VersionSummary(msgspec.Struct, kw_only=True, frozen=True):
    """A version as the list shows it: without its definition (one version's read has it)."""

    id: uuid.UUID
    sequence_id: uuid.UUID | None
    version: int
    step_count: int
    created_at: datetime


def _typed(cls: type[_Row]) -> BaseRowFactory[_Row]:
    """Rows as ``cls``, the stored definition (jsonb) decoded into a :class:`Definition` (what was stored
    was one)."""
    return kwargs_row(lambda **row: msgspec.convert(row, cls))


class _VersionCache:
    """Parsed definitions by (project, version id): versions are immutable, so an entry never goes
    stale. The oldest entry goes first when it is full. A hit takes no lock (a read of a dict is atomic)
    and hashes the ids' integers (a UUID's own hash is a Python call)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: dict[tuple[int, int], tuple[int, Definition]] = {}
        self._lock = threading.Lock()

    def get(
        self, conn: Connection[Any], project_id: uuid.UUID, version_id: uuid.UUID
    ) -> tuple[int, Definition]:
        """The version's number and parsed definition."""
        key = (project_id.int, version_id.int)
        found = self._entries.get(key)
        if found is not None:
            return found
        params = {"project_id": project_id, "id": version_id}
        row = conn.execute(QUERIES["version_definition"], params).fetchone()
        if row is None:
            raise NotFound("sequence version not found", field="version_id")
        found = (row[0], msgspec.convert(row[1], Definition))
        with self._lock:
            self._entries[key] = found
            while len(self._entries) > self._size:
                del self._entries[next(iter(self._entries))]
        return found


_VERSIONS = _VersionCache()


def version_definition(conn: Connection[Any], project_id: uuid.UUID, version_id: uuid.UUID) -> Definition:
    """A pinned version's definition, parsed once per process."""
    return _VERSIONS.get(conn, project_id, version_id)[1]


def version_number(conn: Connection[Any], project_id: uuid.UUID, version_id: uuid.UUID) -> int:
    """A pinned version's number (1, 2, ...), from the same cache as its definition."""
    return _VERSIONS.get(conn, project_id, version_id)[0]


def _encode(definition: Definition) -> Jsonb:
    return Jsonb(msgspec.to_builtins(definition))


def _own_number(conn: Connection[Any], project_id: uuid.UUID, definition: Definition) -> Definition:
    """A fixed sending number must be one of the project's (404 naming ``definition.number_id``)."""
    if definition.number_id is not None:
        try:
            get_number(conn, project_id, definition.number_id)
        except NotFound:
            raise NotFound("number not found", field="definition.number_id") from None
    return definition


def check_draft(data: SequenceCreate | SequenceUpdate) -> None:
    """The checks of a draft's body that need nothing stored, every error at once (one InvalidInput): a name
    that is not blank, a definition PostgreSQL can store (a draft may be incomplete: publishing checks the
    rest)."""
    refusals = Refusals()
    if isinstance(data.name, str):
        with refusals.check():
            validation.name(data.name)
    if isinstance(data.definition, Definition):
        with refusals.check():
            storable(data.definition, "definition")
    refusals.raise_any()


def create_sequence(conn: Connection[Any], project_id: uuid.UUID, data: SequenceCreate) -> Sequence:
    check_draft(data)
    params = {
        "project_id": project_id,
        "name": validation.name(data.name),
        "draft": _encode(_own_number(conn, project_id, storable(data.definition, "definition"))),
    }
    with conn.cursor(row_factory=_typed(Sequence)) as cur:
        sequence = cur.execute(QUERIES["insert_sequence"], params).fetchone()
    assert sequence is not None
    return sequence


def update_sequence(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID, data: SequenceUpdate
) -> Sequence:
    """Edit the draft (name, definition); running enrollments keep the version they pinned."""
    status, _ = lock_sequence(conn, project_id, sequence_id)
    if status == "archived":
        raise Conflict("an archived sequence cannot be edited", field="sequence_id")
    check_draft(data)
    params = {
        "project_id": project_id,
        "id": sequence_id,
        "name": None if isinstance(data.name, msgspec.UnsetType) else validation.name(data.name),
        "draft": (
            None
            if isinstance(data.definition, msgspec.UnsetType)
            else _encode(_own_number(conn, project_id, storable(data.definition, "definition")))
        ),
    }
    with conn.cursor(row_factory=_typed(Sequence)) as cur:
        sequence = cur.execute(QUERIES["update_sequence"], params).fetchone()
    assert sequence is not None
    return sequence


def get_sequence(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID) -> Sequence:
    with conn.cursor(row_factory=_typed(Sequence)) as cur:
        params = {"project_id": project_id, "id": sequence_id}
        sequence = cur.execute(QUERIES["get_sequence"], params).fetchone()
    if sequence is None:
        raise NotFound("sequence not found", field="sequence_id")
    return sequence


def list_sequences(
    conn: Connection[Any],
    project_id: uuid.UUID,
    *,
    limit: int,
    after: uuid.UUID | None,
    status: str | None,
    include_archived: bool = True,
) -> list[Sequence]:
    """A page of the project's sequences (of ``status`` when given; without a status, the archived ones
    only with ``include_archived``)."""
    params = {
        "project_id": project_id,
        "limit": limit,
        "after": after,
        "status": status,
        "include_archived": include_archived,
    }
    with conn.cursor(row_factory=_typed(Sequence)) as cur:
        return cur.execute(QUERIES["list_sequences"], params).fetchall()


def lock_sequence(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID
) -> tuple[str, dict[str, Any]]:
    """Lock a sequence (404 naming ``sequence_id``): its status and its draft as stored."""
    row = conn.execute(QUERIES["lock_sequence"], {"project_id": project_id, "id": sequence_id}).fetchone()
    if row is None:
        raise NotFound("sequence not found", field="sequence_id")
    return row[0], row[1]


def publish_sequence(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID, *, now: datetime | None = None
) -> tuple[Version, bool]:
    """Freeze the draft as the next immutable version and make it the one new enrollments pin; returns it
    and whether it is new. A draft identical to the latest version (compared as JSON) returns that version
    and makes no new one. The winners its splits name are recorded (:func:`record_winners`, chosen
    ``now``)."""
    status, draft = lock_sequence(conn, project_id, sequence_id)
    if status == "archived":
        raise Conflict("an archived sequence cannot be published", field="sequence_id")
    definition = _own_number(conn, project_id, validate_definition(decode_definition(draft)))
    params = {"project_id": project_id, "sequence_id": sequence_id, "definition": _encode(definition)}
    with conn.cursor(row_factory=_typed(Version)) as cur:
        same = cur.execute(QUERIES["latest_version_if_same"], params).fetchone()
    if same is not None:
        return same, False
    return publish_definition(conn, project_id, sequence_id, definition, now=now), True


def publish_definition(
    conn: Connection[Any],
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    definition: Definition,
    *,
    now: datetime | None = None,
) -> Version:
    """Freeze a definition that passed the checks as the sequence's next version, make it the one new
    enrollments pin, and record the winners its splits name (the caller holds the sequence's lock:
    :func:`lock_sequence`)."""
    version = _insert_version(conn, project_id, sequence_id, definition)
    params = {"project_id": project_id, "id": sequence_id, "version_id": version.id}
    conn.execute(QUERIES["set_current_version"], params)
    record_winners(conn, project_id, sequence_id, version.id, definition, now=now)
    if definition.goals or definition.exits:
        after_commit(conn, Invalidate(CRITERIA_INVALIDATION_KIND, project_id))
    return version


class RecordedWinner(msgspec.Struct, kw_only=True, frozen=True):
    variant: str
    #: The newest version naming it.
    version_id: uuid.UUID
    chosen_at: datetime


def record_winners(
    conn: Connection[Any],
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    version_id: uuid.UUID,
    definition: Definition,
    *,
    now: datetime | None,
) -> dict[str, RecordedWinner]:
    """Record what the published ``definition``'s splits say of their experiments' winners, for the
    release to read on every version: a split's ``winner`` is upserted (the same variant keeps when it was
    chosen; ``now``, else the database's clock), a split without one clears a winner chosen before (the
    experiment runs again). Returns the winners recorded, by experiment."""
    splits = [node for node in definition.steps if isinstance(node, SplitStep)]
    won = [split for split in splits if split.winner is not None]
    params: dict[str, Any] = {"project_id": project_id, "sequence_id": sequence_id}
    cleared = [split.experiment for split in splits if split.winner is None]
    if cleared:
        conn.execute(QUERIES["clear_winners"], params | {"experiments": cleared})
    if not won:
        return {}
    params |= {
        "version_id": version_id,
        "experiments": [split.experiment for split in won],
        "variants": [split.winner for split in won],
        "now": now,
    }
    return {
        experiment: RecordedWinner(variant=variant, version_id=recorded_version, chosen_at=chosen_at)
        for experiment, variant, recorded_version, chosen_at in conn.execute(
            QUERIES["record_winners"], params
        )
    }


def set_draft(
    conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID, draft: Definition
) -> None:
    """Replace the draft (a change made for the user, such as a winner chosen; the caller holds the lock)."""
    params = {"project_id": project_id, "id": sequence_id, "name": None, "draft": _encode(draft)}
    conn.execute(QUERIES["update_sequence"], params)


def create_one_off_version(conn: Connection[Any], project_id: uuid.UUID, definition: Definition) -> Version:
    """An inline version with no sequence, for an enrollment that carries its own steps."""
    return _insert_version(conn, project_id, None, check_one_off(definition))


def check_one_off(definition: Definition) -> Definition:
    """A one-off's definition (an enrollment's own steps, named ``steps.0.text``) as it is published:
    storable and passing every check of a published definition, every error at once."""
    refusals = Refusals()
    with refusals.check():
        storable(definition, "")
    with refusals.check():
        validate_definition(definition, field="")
    refusals.raise_any()
    return definition


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
    with conn.cursor(row_factory=_typed(Version)) as cur:
        version = cur.execute(QUERIES["insert_version"], params).fetchone()
    assert version is not None
    return version


def list_versions(
    conn: Connection[Any],
    project_id: uuid.UUID,
    sequence_id: uuid.UUID,
    *,
    limit: int,
    after: uuid.UUID | None = None,
) -> list[VersionSummary]:
    """A page of a sequence's versions, newest first, without their definitions (``after``: the id of the
    last version of the previous page)."""
    get_sequence(conn, project_id, sequence_id)
    with conn.cursor(row_factory=class_row(VersionSummary)) as cur:
        params = {"project_id": project_id, "sequence_id": sequence_id, "limit": limit, "after": after}
        return cur.execute(QUERIES["list_versions"], params).fetchall()


def get_version(conn: Connection[Any], project_id: uuid.UUID, sequence_id: uuid.UUID, number: int) -> Version:
    """One of a sequence's versions by its number, with its definition (404 naming ``version``)."""
    get_sequence(conn, project_id, sequence_id)
    params = {"project_id": project_id, "sequence_id": sequence_id, "version": number}
    with conn.cursor(row_factory=_typed(Version)) as cur:
        found = cur.execute(QUERIES["get_version"], params).fetchone()
    if found is None:
        raise NotFound("sequence version not found", field="version")
    return found


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
    status, _ = lock_sequence(conn, project_id, sequence_id)
    if status not in allowed:
        raise Conflict(f"a {status} sequence cannot be {target}", field="sequence_id")
    conn.execute(
        QUERIES["set_sequence_status"], {"project_id": project_id, "id": sequence_id, "status": target}
    )
    if status == "paused":
        params = {"project_id": project_id, "sequence_id": sequence_id}
        paused = conn.execute(QUERIES["paused_by_sequence"], params).fetchall()
        transitions.resume(conn, project_id, [row[0] for row in paused], now=now)
    return get_sequence(conn, project_id, sequence_id)


def sequence_names(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """The name of each of the project's sequences in ``ids``, in one query (a list's rows)."""
    rows = conn.execute(QUERIES["sequence_names"], {"project_id": project_id, "ids": list(set(ids))})
    return {row[0]: row[1] for row in rows}
