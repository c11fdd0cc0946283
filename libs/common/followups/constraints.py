"""The sending constraints of the release path, checked in this order once a step is due and wanted:

    1 send window        outside it (the step's, else the sequence's, else the project's; in the contact's
                         zone, else the project's) -> defer to the next opening
    2 consent            consent mode ``required`` and the contact's consent not granted -> skip
    3 service window     enforced, and the contact has not written in 24 h -> the step's approved WhatsApp
                         template, or skip (``outside_service_window``)
    4 number             the enrollment's, the sequence's fixed one, the contact's last conversation's, the
                         project's default, any connected one; none connected -> defer 15 s, and after
                         30 min pause (``instance_unavailable``). A project with no numbers registered
                         sends as before (the send lane picks).
    5 pacing             the number's pacing row, locked SKIP LOCKED: busy -> defer; inside its gap -> the
                         enrollment reserves the next free slot and is deferred to it (so the claim does
                         not keep picking it while the number is paced, and other numbers are not starved)
    6 in-flight window   too many follow-ups QUEUED / PROCESSING on the number -> defer
    7 quota, backlog     the monthly quota used up, or the send-lane backlog over its limit -> defer 30 min
    8 per-contact cap    ``max_per_contact_24h`` reached -> defer until the oldest of those is 24 h old

A decision is a :class:`Hold` (what the release step does instead of sending), with the values the check
compared (its part of the decision trace: the step run or the enrollment keeps them), or a
:class:`Sending` (how to send). Nothing here counts or commits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import msgspec
from psycopg import Connection

from libs.common.core.sql import load_queries
from libs.common.followups import held
from libs.common.followups.definition import Definition, Step, WhatsAppTemplate
from libs.common.followups.held import HeldValues
from libs.common.followups.send_window import SendWindow, next_opening, zone
from libs.common.followups.transitions import WaitingReason

QUERIES = load_queries("libs.common.followups", "release_step.sql")

#: Retry delay while no number is usable, and how long until the enrollment pauses.
NUMBER_RETRY = timedelta(seconds=15)
NUMBER_PAUSE_AFTER = timedelta(minutes=30)
#: Deferral while the monthly quota is used up or the send lane's backlog is over its limit.
QUOTA_RETRY = timedelta(minutes=30)
#: The WhatsApp customer-service window: free-form messages only this long after the contact wrote.
SERVICE_WINDOW = timedelta(hours=24)
#: The per-contact cap's period.
CAP_PERIOD = timedelta(hours=24)

#: Why a constraint skips the step (its step run's reason): no consent, or outside the service window
#: without an approved template.
ConstraintSkip = Literal["no_consent", "outside_service_window"]


@dataclass(frozen=True)
class Hold:
    """Do not send now: defer to ``until``, skip, or pause, for ``reason``."""

    action: Literal["defer", "skip", "pause"]
    #: A skip's :data:`ConstraintSkip`; a deferral's (or the pause's) waiting reason.
    reason: ConstraintSkip | WaitingReason
    until: datetime | None = None
    #: Set on the enrollment with a deferral for a missing number (when it became unusable).
    unavailable_since: datetime | None = None
    #: What the check compared (:mod:`~libs.common.followups.held`): kept with the step run or the
    #: enrollment, so "why did it not send" is answered with the values.
    values: HeldValues | None = None


@dataclass(frozen=True)
class Sending:
    """How to send: from ``number_id``, as ``template`` (outside the service window) or free-form."""

    number_id: uuid.UUID | None
    template: WhatsAppTemplate | None = None
    #: The number's pacing gap to keep after this message (0: not paced).
    send_delay_ms: int = 0


class ConstraintState(msgspec.Struct, kw_only=True, frozen=True):
    """The columns of ``release_state`` the constraints read (settings and counts)."""

    timezone: str | None
    project_timezone: str
    consent: str
    last_inbound_at: datetime | None
    has_numbers: bool
    number_id: uuid.UUID | None
    in_flight: int | None
    backlog: int | None
    month_messages: int | None
    recent_followups: list[datetime] | None
    send_window: dict[str, Any] | None
    consent_mode: str
    service_window: str
    max_per_contact_24h: int | None
    send_delay_ms: int
    max_in_flight_per_number: int | None
    monthly_message_quota: int | None
    max_send_lane_backlog: int | None


@dataclass(frozen=True)
class Claimed:
    """What the constraints need to know of the claimed enrollment."""

    id: uuid.UUID
    project_id: uuid.UUID
    number_id: uuid.UUID | None
    waiting_reason: str | None
    unavailable_since: datetime | None


def window_for(step: Step, definition: Definition, state: ConstraintState) -> SendWindow | None:
    """The send window a step obeys: its own, else its sequence's, else the project's."""
    if step.send_window is not None:
        return step.send_window
    if definition.send_window is not None:
        return definition.send_window
    return msgspec.convert(state.send_window, SendWindow) if state.send_window is not None else None


def in_window(step: Step, definition: Definition, state: ConstraintState, moment: datetime) -> datetime:
    """``moment``, or the opening of the step's send window after it (advancing applies the window too)."""
    window = window_for(step, definition, state)
    if window is None:
        return moment
    return next_opening(window, moment, zone(state.timezone, state.project_timezone))


def check(
    conn: Connection[Any],
    enrollment: Claimed,
    step: Step,
    definition: Definition,
    state: ConstraintState,
    now: datetime,
) -> Hold | Sending:
    """Every sending constraint, in order; the first that holds the step back decides."""
    opening = in_window(step, definition, state, now)
    if opening > now:
        window = window_for(step, definition, state)
        tz = zone(state.timezone, state.project_timezone)
        return Hold("defer", "send_window", opening, values=held.send_window(window, opening, tz))
    if state.consent_mode == "required" and state.consent != "granted":
        return Hold(
            "skip", "no_consent", values={"consent": state.consent, "consent_mode": state.consent_mode}
        )
    template = None
    if state.service_window == "enforced" and outside_service_window(state.last_inbound_at, now):
        if step.whatsapp_template is None:
            values: HeldValues = {
                "last_inbound_at": held.moment(state.last_inbound_at),
                "without_template": True,
            }
            return Hold("skip", "outside_service_window", values=values)
        template = step.whatsapp_template
    number_id = enrollment.number_id
    if state.has_numbers:
        if state.number_id is None:
            return _no_number(enrollment, now)
        number_id = state.number_id
    paced = _pacing(conn, enrollment, number_id, state, now)
    if paced is not None:
        return paced
    limit = state.max_in_flight_per_number
    if limit is not None and (state.in_flight or 0) >= limit:
        values = {"in_flight": int(state.in_flight or 0), "limit": limit, "number_id": str(number_id)}
        return Hold("defer", "in_flight", now + NUMBER_RETRY, values=values)
    limit = state.monthly_message_quota
    if limit is not None and (state.month_messages or 0) >= limit:
        used = int(state.month_messages or 0)
        return Hold("defer", "quota", now + QUOTA_RETRY, values={"used": used, "limit": limit})
    limit = state.max_send_lane_backlog
    if limit is not None and (state.backlog or 0) > limit:
        return Hold(
            "defer", "backlog", now + QUOTA_RETRY, values={"backlog": int(state.backlog or 0), "limit": limit}
        )
    cap = state.max_per_contact_24h
    if cap is not None and state.recent_followups is not None and len(state.recent_followups) >= cap:
        until = min(state.recent_followups) + CAP_PERIOD
        tz = zone(state.timezone, state.project_timezone)
        values = held.until(until, tz) | {"sent": len(state.recent_followups), "limit": cap}
        return Hold("defer", "contact_cap", until, values=values)
    return Sending(number_id, template, state.send_delay_ms if number_id is not None else 0)


def outside_service_window(last_inbound_at: datetime | None, now: datetime) -> bool:
    """Whether WhatsApp's 24-hour customer-service window is closed: the contact never wrote, or wrote more
    than 24 hours ago (only an approved template may go out then)."""
    return last_inbound_at is None or now - last_inbound_at >= SERVICE_WINDOW


def _no_number(enrollment: Claimed, now: datetime) -> Hold:
    since = enrollment.unavailable_since or now
    values = {"unavailable_since": held.moment(since)}
    if now - since >= NUMBER_PAUSE_AFTER:
        return Hold("pause", "instance_unavailable", values=values)
    return Hold("defer", "instance_unavailable", now + NUMBER_RETRY, unavailable_since=since, values=values)


def _pacing(
    conn: Connection[Any],
    enrollment: Claimed,
    number_id: uuid.UUID | None,
    state: ConstraintState,
    now: datetime,
) -> Hold | None:
    """Pacing on the number: None when the step may go now."""
    if number_id is None or state.send_delay_ms <= 0:
        return None
    gap = timedelta(milliseconds=state.send_delay_ms)
    params = {"number_id": number_id, "project_id": enrollment.project_id, "now": now}
    conn.execute(QUERIES["insert_pacing"], params)
    row = conn.execute(QUERIES["lock_pacing"], params).fetchone()
    if row is None:  # another release on this number holds its row: come back after a gap
        return Hold("defer", "busy", now + gap, values={"locked": "pacing", "number_id": str(number_id)})
    next_release_at: datetime = row[0]
    if enrollment.waiting_reason == "pacing" or next_release_at <= now:
        return None  # it holds a reserved slot that has come, or the number is free
    # reserve the next free slot: the claim will not see this enrollment again before it
    conn.execute(QUERIES["set_pacing"], params | {"next_release_at": next_release_at + gap})
    values = {
        "number_id": str(number_id),
        "slot": held.moment(next_release_at),
        "gap_ms": state.send_delay_ms,
    }
    return Hold("defer", "pacing", next_release_at, values=values)


def after_queued(conn: Connection[Any], project_id: uuid.UUID, sending: Sending, now: datetime) -> None:
    """Keep the number's pacing gap after a queued follow-up (reserved slots ahead stay reserved)."""
    if sending.number_id is None or sending.send_delay_ms <= 0:
        return
    params = {
        "project_id": project_id,
        "number_id": sending.number_id,
        "next_release_at": now + timedelta(milliseconds=sending.send_delay_ms),
    }
    conn.execute(QUERIES["set_pacing"], params)
