"""Goals and exit criteria: a platform event that a sequence's goal or exit is about ends the contact's live
enrollment at once, mid-delay, in the event's own transaction (:func:`meet_goals`, called for every event
that can fire rules); a goal met by a finished enrollment inside its sequence's conversion window converts
it late; an exit that blocks entry refuses to enroll a contact for whom it holds (:func:`blocking_exits`).

What it costs an event: a project none of whose sequence versions has a goal or exit on that event pays a
dictionary look-up (:class:`CriteriaEvents`, each project's events kept per process, reloaded every
:data:`CACHE_TTL_SECONDS` or when a version with goals or exits is published); the trigger path measures
some 2,000 events/s, and a read more per event would be a round trip more on each. A project that has one
pays one indexed scan of the contact's enrollments (``followup_enrollments_contact_idx``), and, when a pinned
definition (cached per version) has a goal or exit on the event, one statement evaluating every distinct
criterion's conditions (the rules' syntax) over the event, the contact, the conversation, lead and deal.

The enrollments met are locked (``FOR UPDATE``: a release holding one is waited for; the release never
waits for a lock, so the two cannot deadlock) as a stop path locks them, the contact locked by the caller
for the events that lock it. A goal wins over an exit met by the same event; the first goal (or exit) of
the definition that holds names the outcome. Live ones end ``converted`` or ``exited``
(:func:`~libs.common.followups.transitions.end_by_criterion`), finished ones convert late
(:func:`~libs.common.followups.transitions.convert_late`, once), and their follow-up messages still QUEUED
are cancelled as a reply's are. Counted once the transaction committed.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from psycopg import Connection, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from libs.common.core.effects import Observe, after_commit
from libs.common.core.invalidation import on_invalidation
from libs.common.core.metrics import FOLLOWUP_CONVERSIONS, FOLLOWUP_FINISHED
from libs.common.core.sql import load_queries
from libs.common.followups import transitions
from libs.common.followups.definition import MAX_CONVERSION_WINDOW_SECONDS, Definition, Exit, Goal
from libs.common.followups.sequences import CRITERIA_INVALIDATION_KIND, version_definition
from libs.common.followups.stops import cancel_queued_followups
from libs.common.followups.transitions import Met
from libs.common.platform.conditions import (
    EVENT_CONTEXT,
    SEGMENT_CONTEXT,
    compile_conditions,
    parse_conditions,
    parse_segment,
)

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.followups", "goals.sql")

#: How long a project's criteria events are kept without an invalidation (RabbitMQ down).
CACHE_TTL_SECONDS: Final = 30.0

#: The statement evaluating goals' and exits' predicates (``{}``) over an event: the event ``t`` (a row of
#: parameters: the project, contact, conversation and payload) and its context, as a rule's trigger has it.
EVENT_STATEMENT: Final = sql.SQL(
    "SELECT ARRAY[{}]::boolean[]"
    " FROM (VALUES (%s::uuid, %s::uuid, %s::uuid, %s::jsonb))"
    " AS t (project_id, contact_id, conversation_id, payload) {}"
)


class CriteriaEvents:
    """Each project's events that a goal or exit of one of its sequence versions is about, kept for at most
    ``ttl`` seconds or until a version with goals or exits is published (an invalidation). A load that an
    invalidation overtakes is used once but not kept (as the rules' cache)."""

    def __init__(self, ttl: float = CACHE_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._entries: dict[uuid.UUID, tuple[float, frozenset[str]]] = {}
        self._generations: dict[uuid.UUID, int] = {}

    def listens(self, conn: Connection[Any], project_id: uuid.UUID, event: str) -> bool:
        """Whether a goal or exit of the project's sequences is about ``event``."""
        with self._lock:
            entry = self._entries.get(project_id)
            generation = self._generations.get(project_id, 0)
        if entry is None or time.monotonic() - entry[0] > self.ttl:
            loaded = time.monotonic()
            rows = conn.execute(QUERIES["criteria_events"], {"project_id": project_id}).fetchall()
            entry = (loaded, frozenset(row[0] for row in rows))
            with self._lock:
                if generation == self._generations.get(project_id, 0):
                    self._entries[project_id] = entry
        return event in entry[1]

    def invalidate(self, project_id: uuid.UUID) -> None:
        """Forget a project's events: the next event reads them again."""
        with self._lock:
            self._entries.pop(project_id, None)
            self._generations[project_id] = self._generations.get(project_id, 0) + 1


#: This process's criteria events.
CRITERIA = CriteriaEvents()
on_invalidation(CRITERIA_INVALIDATION_KIND, CRITERIA.invalidate)


@dataclass(frozen=True)
class GoalsMet:
    """What an event's goals and exits did; :func:`count_met` counts it once the transaction committed."""

    converted: list[Met] = field(default_factory=list)
    #: Finished enrollments converted late (inside their sequence's conversion window).
    converted_late: list[Met] = field(default_factory=list)
    exited: list[Met] = field(default_factory=list)
    cancelled_message_ids: list[uuid.UUID] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.converted or self.converted_late or self.exited or self.cancelled_message_ids)


def count_met(met: GoalsMet) -> None:
    """Count committed conversions and exits: ``whatstig_followup_finished_total`` (converted, exited) and
    ``whatstig_followup_conversions_total{late}``."""
    if met.converted:
        FOLLOWUP_FINISHED.labels("converted", "none").inc(len(met.converted))
        FOLLOWUP_CONVERSIONS.labels("false").inc(len(met.converted))
    if met.converted_late:
        FOLLOWUP_CONVERSIONS.labels("true").inc(len(met.converted_late))
    if met.exited:
        FOLLOWUP_FINISHED.labels("exited", "none").inc(len(met.exited))


@dataclass(frozen=True)
class _Candidate:
    id: uuid.UUID
    sequence_id: uuid.UUID | None
    contact_id: uuid.UUID
    version_id: uuid.UUID
    live: bool
    last_step_at: datetime | None


def meet_goals(
    conn: Connection[Any],
    project_id: uuid.UUID,
    event: str,
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID | None,
    payload: dict[str, Any],
    now: datetime,
) -> GoalsMet:
    """The goals and exits ``event`` meets for the contact's enrollments, applied in the caller's transaction
    (see the module's docstring); counted once it committed."""
    if not CRITERIA.listens(conn, project_id, event):
        return GoalsMet()
    since = now - timedelta(seconds=MAX_CONVERSION_WINDOW_SECONDS)
    params = {"project_id": project_id, "contact_id": contact_id, "since": since}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(QUERIES["candidates"], params).fetchall()
    # each enrollment's criteria about this event, in the definition's order: goals first
    wanted: dict[uuid.UUID, tuple[_Candidate, list[Goal | Exit]]] = {}
    for row in rows:
        candidate = _Candidate(**row)
        criteria = _criteria(
            version_definition(conn, project_id, candidate.version_id), candidate, event, now
        )
        if criteria:
            wanted[candidate.id] = (candidate, criteria)
    if not wanted:
        return GoalsMet()
    holds = _evaluate(
        conn,
        project_id,
        (c.conditions for _, criteria in wanted.values() for c in criteria),
        contact_id,
        conversation_id,
        payload,
    )
    met: dict[uuid.UUID, tuple[_Candidate, Goal | Exit]] = {}
    for candidate, criteria in wanted.values():
        first = next((c for c in criteria if holds.get(_key(c.conditions), False)), None)
        if first is not None:
            met[candidate.id] = (candidate, first)
    if not met:
        return GoalsMet()
    return _apply(conn, project_id, met, now)


def _criteria(definition: Definition, candidate: _Candidate, event: str, now: datetime) -> list[Goal | Exit]:
    """The enrollment's goals, then exits, about ``event``; a finished one's goals only while inside the
    conversion window after its last step (its exits only cancel the last message it may have queued)."""
    goals: list[Goal | Exit] = [g for g in definition.goals if g.event == event]
    exits: list[Goal | Exit] = [e for e in definition.exits if e.event == event]
    window = timedelta(seconds=definition.conversion_window_seconds)
    if candidate.live or (candidate.last_step_at is not None and candidate.last_step_at + window >= now):
        return goals + exits
    return exits


def _apply(
    conn: Connection[Any],
    project_id: uuid.UUID,
    met: dict[uuid.UUID, tuple[_Candidate, Goal | Exit]],
    now: datetime,
) -> GoalsMet:
    """Lock the enrollments met, end the live ones, convert finished ones late, cancel what they queued."""
    params = {"project_id": project_id, "ids": sorted(met)}
    locked = conn.execute(QUERIES["lock_met"], params).fetchall()
    converting: list[Met] = []
    late: list[Met] = []
    exiting: list[Met] = []
    finished: list[Met] = []  # an exit met by a finished enrollment: only its queued message is cancelled
    for enrollment_id, live, unconverted in locked:
        candidate, criterion = met[enrollment_id]
        found = Met(candidate.id, candidate.sequence_id, candidate.contact_id, criterion.name)
        if isinstance(criterion, Goal):
            if live:
                converting.append(found)
            elif unconverted:  # finished (a release may have just completed it): it converts late
                late.append(found)
        else:
            (exiting if live else finished).append(found)
    converted = transitions.end_by_criterion(conn, project_id, converting, "converted", now=now)
    exited = transitions.end_by_criterion(conn, project_id, exiting, "exited", now=now)
    converted_late = transitions.convert_late(conn, project_id, late, now=now)
    cancelled = cancel_queued_followups(conn, project_id, converted + converted_late, "converted", now=now)
    cancelled += cancel_queued_followups(conn, project_id, exited + finished, "exited", now=now)
    outcome = GoalsMet(converted, converted_late, exited, cancelled)
    if outcome:
        log.info(
            "goals and exits met",
            extra={
                "project_id": str(project_id),
                "contact_id": str(next(iter(met.values()))[0].contact_id),
                "converted": {str(m.id): m.name for m in converted},
                "converted_late": {str(m.id): m.name for m in converted_late},
                "exited": {str(m.id): m.name for m in exited},
                "cancelled_message_ids": [str(i) for i in cancelled],
            },
        )
        after_commit(conn, Observe("goals and exits met", lambda: count_met(outcome)))
    return outcome


def _key(conditions: dict[str, Any] | None) -> str:
    """A condition tree's identity: its canonical JSON (two criteria written alike are evaluated once)."""
    return json.dumps(conditions, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=4096)
def _compiled(key: str, segment: bool = False) -> tuple[sql.Composable, tuple[Any, ...]]:
    """A stored tree's predicate and parameters, compiled once per process (as its JSON reads)."""
    raw = json.loads(key)
    node = parse_segment(raw, "conditions") if segment else parse_conditions(raw, stored=True)
    predicate, params = compile_conditions(node)
    return predicate, tuple(params)


def _evaluate(
    conn: Connection[Any],
    project_id: uuid.UUID,
    trees: Iterable[dict[str, Any] | None],
    contact_id: uuid.UUID,
    conversation_id: uuid.UUID | None,
    payload: dict[str, Any],
) -> dict[str, bool]:
    """Whether each distinct tree holds over the event, in ONE statement (none holds when the contact is
    gone); a tree that is None always holds."""
    keys = list(dict.fromkeys(_key(tree) for tree in trees if tree is not None))
    holds = {_key(None): True}
    if not keys:
        return holds
    predicates: list[sql.Composable] = []
    params: list[Any] = []
    for key in keys:
        predicate, values = _compiled(key)
        predicates.append(predicate)
        params += values
    params += [project_id, contact_id, conversation_id, Jsonb(payload)]
    query = EVENT_STATEMENT.format(sql.SQL(", ").join(predicates), EVENT_CONTEXT)
    row = conn.execute(query, params).fetchone()
    if row is not None:
        holds |= dict(zip(keys, row[0], strict=True))
    else:
        holds = dict.fromkeys(keys, False)
    return holds


def blocking_exits(
    conn: Connection[Any], project_id: uuid.UUID, definition: Definition, contact_ids: list[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """The contacts an exit that blocks entry refuses, with the first such exit whose conditions hold for
    each now (the segment syntax, over the contact, its newest conversation, lead and deal), in ONE
    statement; nothing read for a definition without one."""
    exits = [e for e in definition.exits if e.blocks_entry]
    if not exits or not contact_ids:
        return {}
    predicates: list[sql.Composable] = []
    params: list[Any] = []
    for criterion in exits:
        predicate, values = _compiled(_key(criterion.conditions), segment=True)
        predicates.append(predicate)
        params += values
    params += [project_id, contact_ids]
    query = sql.SQL(
        "SELECT c.id, ARRAY[{}]::boolean[] FROM {} WHERE c.project_id = %s AND c.id = ANY(%s)"
    ).format(sql.SQL(", ").join(predicates), SEGMENT_CONTEXT)
    blocked: dict[uuid.UUID, str] = {}
    for contact_id, holds in conn.execute(query, params).fetchall():
        first = next((e.name for e, held in zip(exits, holds, strict=True) if held), None)
        if first is not None:
            blocked[contact_id] = first
    return blocked
