"""Rules: create, read, list, update, enable / disable, delete and reorder; and the per-process cache of a
project's active rules (their conditions compiled once), which event time asks whether to record a
trigger and the triggers service asks which rules to match.

A rule: ``name``, ``event``, ``conditions`` (a tree, see :mod:`libs.common.platform.conditions`), ``actions``
(see :mod:`libs.common.rules.actions`), ``execution_delay_minutes`` (None: at once; 1 to 43,200) and
``active``. Rules run in ``position`` order, then creation order.

The cache keeps each project's active rules for at most :data:`CACHE_TTL_SECONDS`; a change made here
registers the publication of :data:`INVALIDATION_KIND` (:mod:`libs.common.core.invalidation`) to run after
its commit (:mod:`libs.common.core.effects`): this process forgets the project's rules at once, every other
process within a second.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import msgspec
import psycopg
from psycopg import Connection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from libs.common.contracts.limits import MAX_RULE_ACTIONS, MAX_RULES_PER_PROJECT, Name
from libs.common.core import validation
from libs.common.core.effects import Invalidate, after_commit
from libs.common.core.errors import InvalidInput, NotFound, Refusals
from libs.common.core.invalidation import on_invalidation
from libs.common.core.sql import load_queries
from libs.common.followups.project_settings import get_settings
from libs.common.platform.conditions import (
    Event,
    Node,
    check_event_fields,
    parse_conditions,
)
from libs.common.rules.actions import Action, check_action_count, validate_actions
from libs.common.rules.trace import TracedMatch, traced_match

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.rules", "rules.sql")

#: Longest execution delay: 30 days, in minutes.
MAX_DELAY_MINUTES = 43_200
#: How long a process keeps a project's rules without hearing of a change.
CACHE_TTL_SECONDS = 30.0

#: Why a delay counted in business hours is refused without a delay.
_DELAY_NEEDED = "delay_in_business_hours needs execution_delay_minutes"

DelayMinutes = Annotated[int, msgspec.Meta(ge=1, le=MAX_DELAY_MINUTES)]
Position = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
#: A rule's actions: 1 to 20, as the schema states them (``validate_actions`` checks them, and each one
#: against the project).
Actions = Annotated[
    list[Action], msgspec.Meta(extra_json_schema={"minItems": 1, "maxItems": MAX_RULE_ACTIONS})
]


class RuleCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name
    event: Event
    #: A tree of ``all`` / ``any`` groups with ``{attribute, operator, value}`` leaves; absent: always.
    conditions: dict[str, Any] | None = None
    actions: Actions
    #: Run the actions this many minutes after the event, if the conditions still hold then.
    execution_delay_minutes: DelayMinutes | None = None
    #: Count the delay in the project's business hours only (see the settings' ``business_hours``).
    delay_in_business_hours: bool = False
    active: bool = True
    #: Where the rule runs among the project's rules (absent: last).
    position: Position | None = None


class RuleUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A partial update: absent fields are kept."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    event: Event | msgspec.UnsetType = msgspec.UNSET
    conditions: dict[str, Any] | msgspec.UnsetType | None = msgspec.UNSET
    actions: Actions | msgspec.UnsetType = msgspec.UNSET
    execution_delay_minutes: DelayMinutes | msgspec.UnsetType | None = msgspec.UNSET
    delay_in_business_hours: bool | msgspec.UnsetType = msgspec.UNSET
    active: bool | msgspec.UnsetType = msgspec.UNSET
    position: Position | msgspec.UnsetType = msgspec.UNSET


class Rule(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    name: str
    event: Event
    conditions: dict[str, Any]
    actions: list[Action]
    execution_delay_minutes: int | None
    delay_in_business_hours: bool
    #: The delay as the rule list shows it: ``immediately``, ``45m``, ``4h``, ``1d 2h``.
    runs_after: str
    active: bool
    position: int
    created_at: datetime
    updated_at: datetime


def runs_after(minutes: int | None) -> str:
    """A delay as the rule list shows it: ``immediately``, ``45m``, ``4h``, ``1d 2h``."""
    if minutes is None:
        return "immediately"
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{mins}m" if mins else ""]
    return " ".join(part for part in parts if part)


def check_rule(data: RuleCreate | RuleUpdate) -> Node | None:
    """The checks of a rule's body that need nothing stored, every error at once (one InvalidInput): its
    name, its conditions (and the event fields they name, when the body gives the event), its number of
    actions, a delay in business hours that has a delay (when the body gives both). Returns the parsed
    conditions (None: the body leaves them as they are)."""
    refusals = Refusals()
    if isinstance(data.name, str):
        with refusals.check():
            validation.name(data.name)
    conditions = None
    if data.conditions is not msgspec.UNSET:
        with refusals.check():
            conditions = parse_conditions(data.conditions)
            if isinstance(data.event, str):
                check_event_fields(conditions, data.event)
    if isinstance(data.actions, list):
        with refusals.check():
            check_action_count(data.actions)
    if data.delay_in_business_hours is True and data.execution_delay_minutes is None:
        refusals.add("delay_in_business_hours", _DELAY_NEEDED)
    refusals.raise_any()
    return conditions


def _check_delay(conn: Connection[Any], project_id: uuid.UUID, minutes: int | None, business: bool) -> None:
    """A delay in business hours needs a delay, and the project's business hours to count it in."""
    if not business:
        return
    if minutes is None:
        raise InvalidInput(_DELAY_NEEDED, field="delay_in_business_hours")
    if get_settings(conn, project_id).business_hours is None:
        raise InvalidInput(
            "the project has no business hours: set them with PUT /v1/settings (business_hours) first",
            field="delay_in_business_hours",
        )


def _rules(rows: list[dict[str, Any]]) -> list[Rule]:
    return msgspec.convert(
        [row | {"runs_after": runs_after(row["execution_delay_minutes"])} for row in rows], list[Rule]
    )


def _row(conn: Connection[Any], query: str, params: dict[str, Any]) -> Rule | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(QUERIES[query], params).fetchone()
    return _rules([row])[0] if row is not None else None


def create_rule(conn: Connection[Any], project_id: uuid.UUID, data: RuleCreate, *, now: datetime) -> Rule:
    conditions = check_rule(data)
    assert conditions is not None  # a new rule's conditions are given (None: always)
    _check_delay(conn, project_id, data.execution_delay_minutes, data.delay_in_business_hours)
    params = {
        "project_id": project_id,
        "name": validation.name(data.name),
        "event": data.event,
        "conditions": Jsonb(conditions.to_json()),
        "actions": Jsonb(msgspec.to_builtins(validate_actions(conn, project_id, data.actions))),
        "execution_delay_minutes": data.execution_delay_minutes,
        "delay_in_business_hours": data.delay_in_business_hours,
        "active": data.active,
        "position": data.position,
        "now": now,
    }
    _check_room(conn, project_id)
    rule = _row(conn, "insert_rule", params)
    assert rule is not None
    _changed(conn, project_id)
    return rule


def _check_room(conn: Connection[Any], project_id: uuid.UUID) -> None:
    """Refuse a new rule of a project that holds :data:`MAX_RULES_PER_PROJECT` (creates of one project are
    serialised until they commit, so two at once cannot both take the last place)."""
    conn.execute(QUERIES["lock_rule_count"], {"project_id": project_id})
    row = conn.execute(QUERIES["count_rules"], {"project_id": project_id}).fetchone()
    assert row is not None
    if row[0] >= MAX_RULES_PER_PROJECT:
        raise InvalidInput(f"a project has at most {MAX_RULES_PER_PROJECT} rules", field="body")


def get_rule(conn: Connection[Any], project_id: uuid.UUID, rule_id: uuid.UUID) -> Rule:
    rule = _row(conn, "get_rule", {"project_id": project_id, "id": rule_id})
    if rule is None:
        raise NotFound("rule not found", field="rule_id")
    return rule


def list_rules(
    conn: Connection[Any],
    project_id: uuid.UUID,
    *,
    limit: int,
    after: uuid.UUID | None = None,
    event: str | None = None,
    active: bool | None = None,
) -> list[Rule]:
    params = {"project_id": project_id, "limit": limit, "after": after, "event": event, "active": active}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(QUERIES["list_rules"], params).fetchall()
    return _rules(rows)


def update_rule(
    conn: Connection[Any], project_id: uuid.UUID, rule_id: uuid.UUID, data: RuleUpdate, *, now: datetime
) -> Rule:
    current = _row(conn, "lock_rule", {"project_id": project_id, "id": rule_id})
    if current is None:
        raise NotFound("rule not found", field="rule_id")
    given = check_rule(data)
    conditions = parse_conditions(current.conditions, stored=True) if given is None else given
    check_event_fields(conditions, current.event if data.event is msgspec.UNSET else data.event)
    actions = (
        current.actions if data.actions is msgspec.UNSET else validate_actions(conn, project_id, data.actions)
    )
    delay = (
        current.execution_delay_minutes
        if data.execution_delay_minutes is msgspec.UNSET
        else data.execution_delay_minutes
    )
    business = (
        current.delay_in_business_hours
        if data.delay_in_business_hours is msgspec.UNSET
        else data.delay_in_business_hours
    )
    _check_delay(conn, project_id, delay, business)
    params = {
        "project_id": project_id,
        "id": rule_id,
        "name": current.name if data.name is msgspec.UNSET else validation.name(data.name),
        "event": current.event if data.event is msgspec.UNSET else data.event,
        "conditions": Jsonb(conditions.to_json()),
        "actions": Jsonb(msgspec.to_builtins(actions)),
        "execution_delay_minutes": delay,
        "delay_in_business_hours": business,
        "active": current.active if data.active is msgspec.UNSET else data.active,
        "position": current.position if data.position is msgspec.UNSET else data.position,
        "now": now,
    }
    rule = _row(conn, "update_rule", params)
    assert rule is not None
    _changed(conn, project_id)
    return rule


def delete_rule(conn: Connection[Any], project_id: uuid.UUID, rule_id: uuid.UUID) -> None:
    if conn.execute(QUERIES["delete_rule"], {"project_id": project_id, "id": rule_id}).fetchone() is None:
        raise NotFound("rule not found", field="rule_id")
    _changed(conn, project_id)


def _changed(conn: Connection[Any], project_id: uuid.UUID) -> None:
    """Once the change committed, every process forgets the project's cached rules (this one at once)."""
    after_commit(conn, Invalidate(INVALIDATION_KIND, project_id))


# --- the per-process cache ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActiveRule:
    """An active rule as the triggers service runs it: its conditions parsed and compiled once."""

    id: uuid.UUID
    event: str
    conditions: Node
    #: Its column in the triggers service's matching statement: its verdict over a trigger, and the trace
    #: of one it holds for (its conditions compiled over ``matching.CONTEXT``, their values written in).
    traced: TracedMatch
    actions: list[Action]
    execution_delay_minutes: int | None
    delay_in_business_hours: bool
    #: The rule as it was read: a reload keeps the rule compiled while it reads the same.
    source: Rule


def compile_rule(conn: Connection[Any], rule: Rule) -> ActiveRule:
    """A rule as the triggers service runs it: its conditions parsed and compiled (a dry run of an inactive
    rule too)."""
    node = parse_conditions(rule.conditions, stored=True)
    return ActiveRule(
        rule.id,
        rule.event,
        node,
        traced_match(conn, node),
        rule.actions,
        rule.execution_delay_minutes,
        rule.delay_in_business_hours,
        rule,
    )


#: Rules to compile with more condition nodes than this together (~10 ms of compiling) are compiled in the
#: background: :meth:`RuleCache.ready` answers None meanwhile, so a project's big rule set never holds up a
#: batch that other projects' triggers share.
INLINE_COMPILE_NODES = 100
#: The interpreter's thread switch interval while rules compile in the background (Python's default is
#: 5 ms): the loop's thread, back from each database round trip, waits at most this long for the
#: interpreter instead of 5 ms, so a batch of fifty round trips is not slowed by a quarter of a second.
WARMING_SWITCH_INTERVAL = 0.0005


class RuleCache:
    """Each project's active rules by event, kept for at most ``ttl`` seconds or until invalidated.

    A load that an invalidation overtakes (the change committed while the rules were being read) is used
    once but not kept: each invalidation moves the project's generation on, and a load is stored only when
    the generation it started under is still current.

    Compiling is what costs (a rule of a hundred leaves takes milliseconds), so it is apart from loading:
    a rule is compiled when first asked for, and kept while it reads the same (a reload every ``ttl`` costs
    a read; a change, that rule's compile). Asking whether a project listens to an event
    (:meth:`listens`) compiles nothing.
    """

    def __init__(self, ttl: float = CACHE_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._entries: dict[uuid.UUID, tuple[float, dict[str, list[Rule]]]] = {}
        self._generations: dict[uuid.UUID, int] = {}
        self._epoch = 0  # moved on by invalidate(None)
        #: Each project's compiled rules, by id (those of its latest load).
        self._compiled: dict[uuid.UUID, dict[uuid.UUID, ActiveRule]] = {}
        #: The projects whose rules are being compiled in the background.
        self._warming: set[uuid.UUID] = set()
        #: The interpreter's switch interval before the first background compile (put back after the last).
        self._switch_interval = sys.getswitchinterval()
        #: Rules (as they read) whose compile in the background failed: compiled in the caller's next time,
        #: so the error is the caller's (its items back off).
        self._broken: dict[uuid.UUID, Rule] = {}

    def listens(self, conn: Connection[Any], project_id: uuid.UUID, event: str) -> bool:
        """Whether the project has an active rule for ``event`` (nothing is compiled)."""
        return bool(self._rows(conn, project_id).get(event))

    def rules(self, conn: Connection[Any], project_id: uuid.UUID, event: str) -> list[ActiveRule]:
        """The project's active rules for ``event``, in the order they run, compiled now if need be."""
        return [self._compile(conn, project_id, rule) for rule in self._rows(conn, project_id).get(event, [])]

    def ready(
        self, conn: Connection[Any], project_id: uuid.UUID, event: str, pool: ConnectionPool
    ) -> list[ActiveRule] | None:
        """As :meth:`rules`, or None while they are compiled in the background (on a connection of its own
        to ``pool``'s server), when more than :data:`INLINE_COMPILE_NODES` nodes are left to compile."""
        rows = self._rows(conn, project_id).get(event, [])
        with self._lock:
            known = self._compiled.get(project_id, {})
            missing = [rule for rule in rows if not _current(known.get(rule.id), rule)]
            broken = any(self._broken.get(rule.id) == rule for rule in missing)
        if broken or sum(_nodes(rule.conditions) for rule in missing) <= INLINE_COMPILE_NODES:
            return [self._compile(conn, project_id, rule) for rule in rows]
        self._warm(project_id, missing, pool)
        return None

    def rule(self, conn: Connection[Any], project_id: uuid.UUID, rule_id: uuid.UUID) -> ActiveRule | None:
        """One of the project's active rules, as it is now (None: deleted or inactive)."""
        rows = self._rows(conn, project_id)
        found = next((rule for rules in rows.values() for rule in rules if rule.id == rule_id), None)
        return None if found is None else self._compile(conn, project_id, found)

    def _compile(self, conn: Connection[Any], project_id: uuid.UUID, rule: Rule) -> ActiveRule:
        with self._lock:
            active = self._compiled.get(project_id, {}).get(rule.id)
        if not _current(active, rule):
            active = compile_rule(conn, rule)
            with self._lock:
                self._compiled.setdefault(project_id, {})[rule.id] = active
        assert active is not None
        return active

    def _warm(self, project_id: uuid.UUID, rules: list[Rule], pool: ConnectionPool) -> None:
        """Compile ``rules`` in a thread of their own, one per project at a time."""
        with self._lock:
            if project_id in self._warming:
                return
            if not self._warming:  # the first: threads waiting on I/O get the interpreter back sooner
                self._switch_interval = sys.getswitchinterval()
                sys.setswitchinterval(min(self._switch_interval, WARMING_SWITCH_INTERVAL))
            self._warming.add(project_id)

        def compile_all() -> None:
            started = time.monotonic()
            try:
                conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
                kwargs = pool.kwargs() if callable(pool.kwargs) else pool.kwargs or {}
                with psycopg.connect(conninfo, **kwargs) as conn:
                    for rule in rules:
                        time.sleep(0.001)  # between rules the loop's thread takes the interpreter back
                        try:
                            self._compile(conn, project_id, rule)
                        except Exception:
                            with self._lock:
                                self._broken[rule.id] = rule
                            raise
            except Exception:
                log.exception("rules not compiled in the background", extra={"project_id": str(project_id)})
            else:
                took = round(time.monotonic() - started, 3)
                log.info(
                    "rules compiled in the background",
                    extra={"project_id": str(project_id), "rules": len(rules), "seconds": took},
                )
            finally:
                with self._lock:
                    self._warming.discard(project_id)
                    if not self._warming:
                        sys.setswitchinterval(self._switch_interval)

        threading.Thread(target=compile_all, name=f"rules-{project_id}", daemon=True).start()

    def _rows(self, conn: Connection[Any], project_id: uuid.UUID) -> dict[str, list[Rule]]:
        with self._lock:
            entry = self._entries.get(project_id)
            generation = (self._epoch, self._generations.get(project_id, 0))
        if entry is None or time.monotonic() - entry[0] > self.ttl:
            loaded = time.monotonic()
            with conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(QUERIES["active_rules"], {"project_id": project_id}).fetchall()
            by_event: dict[str, list[Rule]] = {}
            for rule in _rules(rows):
                by_event.setdefault(rule.event, []).append(rule)
            entry = (loaded, by_event)
            ids = {rule.id for rules in by_event.values() for rule in rules}
            with self._lock:
                known = self._compiled.get(project_id, {})
                self._compiled[project_id] = {i: a for i, a in known.items() if i in ids}
                if generation == (self._epoch, self._generations.get(project_id, 0)):
                    self._entries[project_id] = entry
        return entry[1]

    def invalidate(self, project_id: uuid.UUID | None = None) -> None:
        """Forget a project's rules (every project's with None): the next read loads them again."""
        with self._lock:
            if project_id is None:
                self._entries.clear()
                self._epoch += 1
            else:
                self._entries.pop(project_id, None)
                self._generations[project_id] = self._generations.get(project_id, 0) + 1


def _current(active: ActiveRule | None, rule: Rule) -> bool:
    """Whether ``active`` was compiled from the rule as it reads now."""
    return active is not None and active.source == rule


def _nodes(raw: Any) -> int:
    """How many nodes a stored condition tree has (groups and leaves)."""
    if isinstance(raw, dict):
        children = raw.get("all", raw.get("any"))
        if isinstance(children, list):
            return 1 + sum(_nodes(child) for child in children)
        return 1
    return 0


#: This process's rule cache.
RULES = RuleCache()
#: What a change to a project's rules invalidates (publish it after the commit: see core.invalidation).
INVALIDATION_KIND = "rules"
on_invalidation(INVALIDATION_KIND, RULES.invalidate)
