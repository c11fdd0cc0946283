"""The sending constraints of the release path, checked in this order once a step is due and wanted:

    1 send window        outside it (the step's, else the sequence's, else the project's; in the contact's
                         zone, else the project's) -> defer to the next opening
    2 consent            consent mode ``required`` and the contact's consent not granted -> skip
    3 service window     enforced, and the contact has not written in 24 h -> the step's approved WhatsApp
                         template, or skip (``outside_service_window``)
      marketing limit    a marketing step, and the provider refused the contact a marketing message for its
                         own limit (131049: ``marketing_limited_until``) -> defer until then
                         (``user_marketing_limit``)
      recipient gap      the contact was sent a message (by anything) less than ``min_recipient_gap_seconds``
                         ago -> defer to the gap's end (``recipient_gap``)
    4 number             the enrollment's, the sequence's fixed one, the contact's last conversation's, the
                         project's default, any connected one; none connected -> defer 15 s, and after
                         30 min pause (``instance_unavailable``). A project with no numbers registered
                         sends as before (the send lane picks).
    5 pacing             the number's pacing row, locked SKIP LOCKED: busy -> defer; inside its gap -> the
                         enrollment reserves the next free slot and is deferred to it (so the claim does
                         not keep picking it while the number is paced, and other numbers are not starved);
                         the gap is the project's, or wider while the provider rate-limits the number
                         (:mod:`~libs.common.followups.pacing`)
    6 in-flight window   too many follow-ups QUEUED / PROCESSING on the number -> defer
    7 quota, backlog     the monthly quota used up, or the send-lane backlog over its limit -> defer 30 min
    8 frequency caps     a marketing step, and the engine's messages to the contact (of every kind: sequences,
                         one-offs, AI, rules) reached ``max_per_contact_24h`` -> defer until the oldest of
                         those is 24 h old (``contact_cap``); or ``max_per_contact_day`` since midnight in
                         the contact's zone -> defer to the next midnight (``contact_day_cap``). Utility
                         and service steps pass (:func:`frequency_cap`)
    9 messaging limit    the number's business portfolio (if any), a conversation the business opens (the
                         contact has not written in 24 h) with a recipient new in 24 h: past the tier's
                         limit, or the number's equal share of it -> defer until the first hour that counts
                         has left the window (``messaging_limit``); else the recipient is counted
                         (:func:`libs.common.platform.portfolios.admit`)

A decision is a :class:`Hold` (what the release step does instead of sending), with the values the check
compared (its part of the decision trace: the step run or the enrollment keeps them), or a
:class:`Sending` (how to send). Nothing here commits; only the last check, the messaging limit, writes: it
counts the recipient it lets through.
"""

from __future__ import annotations

import uuid
from datetime import datetime, time, timedelta, tzinfo
from typing import Any, Literal

import msgspec
from psycopg import Connection

from libs.common.core.reasons import FrequencyCap
from libs.common.core.sql import load_queries
from libs.common.followups import held, pacing
from libs.common.followups.definition import Definition, Step, WhatsAppTemplate
from libs.common.followups.held import HeldValues
from libs.common.followups.send_window import SendWindow, next_opening, zone
from libs.common.followups.transitions import WaitingReason
from libs.common.platform import portfolios

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


class Hold(msgspec.Struct, frozen=True):
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


class Sending(msgspec.Struct, frozen=True):
    """How to send: from ``number_id``, as ``template`` (outside the service window) or free-form."""

    number_id: uuid.UUID | None
    template: WhatsAppTemplate | None = None
    #: The number's pacing gap to keep after this message (0: not paced).
    send_delay_ms: int = 0


class ConstraintState(msgspec.Struct, frozen=True):
    """The columns of ``release_state`` the constraints read (settings and counts); every one is read, so
    none has a default (the release step makes it by position)."""

    timezone: str | None
    project_timezone: str
    consent: str
    last_inbound_at: datetime | None
    has_numbers: bool
    number_id: uuid.UUID | None
    in_flight: int | None
    backlog: int | None
    month_messages: int | None
    #: When the engine's last messages to the contact within 24 h were queued (read when a cap is set).
    recent_messages: list[datetime] | None
    send_window: dict[str, Any] | None
    consent_mode: str
    service_window: str
    max_per_contact_24h: int | None
    max_per_contact_day: int | None
    send_delay_ms: int
    max_in_flight_per_number: int | None
    monthly_message_quota: int | None
    max_send_lane_backlog: int | None
    #: The least time between two messages to the contact, and when it was last sent one (read only
    #: when the gap is set).
    min_recipient_gap_seconds: int
    last_outbound_at: datetime | None
    #: Until when the provider refuses the contact marketing messages (131049), if it did.
    marketing_limited_until: datetime | None
    #: The chosen number's business portfolio (its messaging limit), if it has one.
    portfolio_id: uuid.UUID | None
    #: The number's pacing widened by a rate limit, and when (:mod:`~libs.common.followups.pacing`).
    widened_gap_ms: int
    widened_at: datetime | None


class Claimed(msgspec.Struct, frozen=True):
    """What the constraints need to know of the claimed enrollment."""

    id: uuid.UUID
    project_id: uuid.UUID
    number_id: uuid.UUID | None
    waiting_reason: str | None
    unavailable_since: datetime | None
    contact_id: uuid.UUID


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
    limited = state.marketing_limited_until
    if limited is not None and limited > now and definition.category_of(step) == "marketing":
        return Hold("defer", "user_marketing_limit", limited, values={"until": held.moment(limited)})
    spaced = recipient_gap_end(state.min_recipient_gap_seconds, state.last_outbound_at)
    if spaced is not None and spaced > now:
        gap = {
            "last_outbound_at": held.moment(state.last_outbound_at),
            "gap_s": state.min_recipient_gap_seconds,
        }
        return Hold("defer", "recipient_gap", spaced, values=gap)
    number_id = enrollment.number_id
    if state.has_numbers:
        if state.number_id is None:
            return _no_number(enrollment, now)
        number_id = state.number_id
    gap_ms = pacing.gap_ms(state.send_delay_ms, state.widened_gap_ms, state.widened_at, now)
    paced = _pacing(conn, enrollment, number_id, gap_ms, now)
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
    if definition.category_of(step) == "marketing":
        capped = frequency_cap(
            state.max_per_contact_24h,
            state.max_per_contact_day,
            state.recent_messages or [],
            zone(state.timezone, state.project_timezone),
            now,
        )
        if capped is not None:
            tz = zone(state.timezone, state.project_timezone)
            limit = state.max_per_contact_24h if capped[0] == "contact_cap" else state.max_per_contact_day
            values = held.until(capped[1], tz) | {"sent": len(state.recent_messages or []), "limit": limit}
            return Hold("defer", capped[0], capped[1], values=values)
    business_initiated = outside_service_window(state.last_inbound_at, now)
    if state.portfolio_id is not None and number_id is not None and business_initiated:
        # the last check, as it counts the recipient: a business-initiated conversation of the portfolio
        until = portfolios.admit(
            conn, enrollment.project_id, state.portfolio_id, number_id, enrollment.contact_id, now=now
        )
        if until is not None:
            values = {"portfolio_id": str(state.portfolio_id), "number_id": str(number_id)}
            return Hold("defer", "messaging_limit", until, values=values | {"until": held.moment(until)})
    return Sending(number_id, template, gap_ms if number_id is not None else 0)


def recipient_gap_end(gap_seconds: int, last_outbound_at: datetime | None) -> datetime | None:
    """When the next message to a contact last sent one at ``last_outbound_at`` may go (None: any time)."""
    if gap_seconds <= 0 or last_outbound_at is None:
        return None
    return last_outbound_at + timedelta(seconds=gap_seconds)


def frequency_cap(
    per_24h: int | None, per_day: int | None, recent: list[datetime], where: tzinfo, now: datetime
) -> tuple[FrequencyCap, datetime] | None:
    """Which cap a marketing message to a contact breaks and until when (None: neither): ``recent`` are
    when the engine's messages to the contact within 24 h were queued (at least as many as the larger cap,
    when there are); the day is the calendar day in ``where``, the contact's zone."""
    if per_24h is not None and len(recent) >= per_24h:
        return "contact_cap", sorted(recent, reverse=True)[per_24h - 1] + CAP_PERIOD
    if per_day is not None:
        today = now.astimezone(where).date()
        midnight = datetime.combine(today, time(), where)
        if sum(1 for sent in recent if sent >= midnight) >= per_day:
            return "contact_day_cap", datetime.combine(today + timedelta(days=1), time(), where)
    return None


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
    gap_ms: int,
    now: datetime,
) -> Hold | None:
    """Pacing on the number (a gap of ``gap_ms``): None when the step may go now."""
    if number_id is None or gap_ms <= 0:
        return None
    gap = timedelta(milliseconds=gap_ms)
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
    values = {"number_id": str(number_id), "slot": held.moment(next_release_at), "gap_ms": gap_ms}
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
