"""The send lane's side of the contract.

A send lane (the service that talks to the messaging provider) claims QUEUED outbound messages, QUEUED
to PROCESSING under ``FOR UPDATE SKIP LOCKED`` in priority then age order, then reports what happened
to each: SENT, DELIVERED, READ or FAILED. Every claim is one project's statement (on Citus, routed to one
shard): a claim for all projects takes them in turns, each project its share (one read across projects
gives the shares, then each project's claim, all in one round trip), and a claim number by number is one
statement per project. Statuses are idempotent and monotonic: a status that would go
backwards (READ, then SENT) is ignored and logged.

Until a message is claimed, a stop path (a reply, say) may still cancel it; once claimed it is the send
lane's. That is what makes "the reply always wins until the send lane picks the message up" real.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec
from psycopg import Connection
from psycopg.rows import class_row

from libs.common.contracts.actors import MAX_CLAIM
from libs.common.contracts.events import STATUS_REPORTED, MessageClaimed, MessageFailed, MessageSent
from libs.common.contracts.platform_events import ReportedStatus
from libs.common.core.db import fetch_each
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.core.jobs import RoundRobin, claim_in_turns
from libs.common.core.outbox import write_events
from libs.common.core.sql import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries("libs.common.platform", "send_lane.sql")
#: The two claims: each picks its messages its own way (locked, ``SKIP LOCKED``), then claims them alike.
CLAIM_QUEUED_MESSAGES = QUERIES["pick_queued_messages"] + "\n" + QUERIES["claim_picked"]
CLAIM_QUEUED_FOR_NUMBERS = QUERIES["pick_queued_for_numbers"] + "\n" + QUERIES["claim_picked"]


#: Where this process's claims for all projects resume: in turns across the projects with QUEUED messages.
TURNS = RoundRobin()

#: Progress order of an outbound message; FAILED and CANCELLED end it.
RANK = {"QUEUED": 0, "PROCESSING": 1, "SENT": 2, "DELIVERED": 3, "READ": 4}
FINAL = {"READ", "FAILED", "CANCELLED"}


class ClaimRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_CLAIM)] = 50
    number_id: uuid.UUID | None = None


class ClaimedMessage(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    project_id: uuid.UUID
    contact_id: uuid.UUID
    phone: str | None
    conversation_id: uuid.UUID | None
    number_id: uuid.UUID | None
    priority: int
    body: str | None
    media_url: str | None
    media_kind: str | None
    source: str
    followup_enrollment_id: uuid.UUID | None
    #: Set when the message is an approved WhatsApp template (then ``body`` is null).
    template_name: str | None
    template_language: str | None
    template_parameters: list[str] | None
    created_at: datetime


class StatusReport(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the send lane learned about a message, by our id or the provider's."""

    status: ReportedStatus
    message_id: uuid.UUID | None = None
    provider_message_id: str | None = None
    error: str | None = None
    #: The provider's code of a failure (docs/providers.md), kept beside ``error``.
    error_code: str | None = None


class NumberQuota(msgspec.Struct, kw_only=True, frozen=True):
    """How many QUEUED messages of one number a claim may take."""

    project_id: uuid.UUID
    number_id: uuid.UUID
    quota: int


class MessageState(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    status: str
    provider_message_id: str | None
    error: str | None
    error_code: str | None
    status_changed_at: datetime
    followup_enrollment_id: uuid.UUID | None
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    number_id: uuid.UUID | None = None


def claim_messages(
    conn: Connection[Any], project_id: uuid.UUID | None, request: ClaimRequest, *, now: datetime
) -> list[ClaimedMessage]:
    """Claim up to ``limit`` QUEUED outbound messages of the project, priority then age order; with
    ``project_id`` None, of all projects in turns (each its share of ``limit``)."""
    params = {"number_id": request.number_id, "limit": request.limit, "now": now}
    rows = class_row(ClaimedMessage)
    # never a prepared statement: its generic plan cannot see whether the number filter is NULL, guesses a
    # handful of rows, and reads and sorts the whole QUEUED backlog instead of walking the queued index in
    # order; a fresh plan per claim folds the NULL filter away and keeps the claim cost flat
    if project_id is not None:
        one = params | {"project_id": project_id, "share": request.limit}
        claimed = fetch_each(conn, CLAIM_QUEUED_MESSAGES, [one], rows, prepare=False)
    else:
        shares = QUERIES["queued_shares"]
        claimed = claim_in_turns(
            conn, shares, CLAIM_QUEUED_MESSAGES, params | TURNS.params(request.limit), rows, prepare=False
        )
        TURNS.served(list(dict.fromkeys(m.project_id for m in claimed)))
    _claimed(conn, claimed, now)
    return claimed


def claim_for_numbers(
    conn: Connection[Any], quotas: list[NumberQuota], *, now: datetime
) -> list[ClaimedMessage]:
    """Claim QUEUED outbound messages number by number: up to each number's quota, its oldest of the
    highest priority first (each number of each project probed on its own index range: fair across
    numbers and projects, whatever one of them has queued)."""
    by_project: dict[uuid.UUID, list[NumberQuota]] = {}
    for quota in quotas:
        by_project.setdefault(quota.project_id, []).append(quota)
    params = [  # one statement per project, all in one round trip
        {
            "project_id": project_id,
            "number_ids": [q.number_id for q in numbers],
            "quotas": [q.quota for q in numbers],
            "now": now,
        }
        for project_id, numbers in by_project.items()
    ]
    claimed = fetch_each(conn, CLAIM_QUEUED_FOR_NUMBERS, params, class_row(ClaimedMessage))
    _claimed(conn, claimed, now)
    return claimed


def queued_per_number(
    conn: Connection[Any], numbers: list[tuple[uuid.UUID, uuid.UUID]], *, cap: int
) -> dict[tuple[uuid.UUID, uuid.UUID], int]:
    """How many QUEUED outbound messages each (project, number) has, counted up to ``cap``."""
    if not numbers:
        return {}
    params = {"project_ids": [p for p, _ in numbers], "number_ids": [n for _, n in numbers], "cap": cap}
    rows = conn.execute(QUERIES["queued_per_number"], params).fetchall()
    return {(project_id, number_id): queued for project_id, number_id, queued in rows}


def claimed_messages(
    conn: Connection[Any], project_id: uuid.UUID, message_ids: list[uuid.UUID]
) -> list[ClaimedMessage]:
    """Claimed (PROCESSING) outbound messages of the project, as the claim returned them (a send retried)."""
    params = {"project_id": project_id, "ids": message_ids}
    with conn.cursor(row_factory=class_row(ClaimedMessage)) as cur:
        return cur.execute(QUERIES["claimed_messages"], params).fetchall()


def _claimed(conn: Connection[Any], claimed: list[ClaimedMessage], now: datetime) -> None:
    """The ``message.claimed`` events and the log line of a claim."""
    by_project: dict[uuid.UUID, list[MessageClaimed]] = {}
    for m in claimed:
        # the event carries what the claim returns (a send lane claiming over RabbitMQ learns of it so)
        fields = {f: getattr(m, f) for f in MessageClaimed.__struct_fields__ if f != "message_id"}
        by_project.setdefault(m.project_id, []).append(MessageClaimed(message_id=m.id, **fields))
    for project, events in by_project.items():
        write_events(conn, project, events, occurred_at=now)
    if claimed:
        log.info(
            "messages claimed", extra={"count": len(claimed), "message_ids": [str(m.id) for m in claimed]}
        )


def report_status(
    conn: Connection[Any], project_id: uuid.UUID, report: StatusReport, *, now: datetime
) -> tuple[MessageState, bool]:
    """Apply a status report; returns the message's state and whether the report changed it."""
    if report.message_id is None and report.provider_message_id is None:
        raise InvalidInput("give message_id or provider_message_id", field="message_id")
    params: dict[str, Any] = {
        "project_id": project_id,
        "id": report.message_id,
        "provider_message_id": report.provider_message_id,
    }
    with conn.cursor(row_factory=class_row(MessageState)) as cur:
        current = cur.execute(QUERIES["lock_message"], params).fetchone()
    if current is None:
        raise NotFound(
            "message not found", field="message_id" if report.message_id else "provider_message_id"
        )
    if not _moves_forward(current.status, report.status):
        if current.status != report.status:
            log.warning(
                "status report ignored: it would go backwards",
                extra={"message_id": str(current.id), "current": current.status, "reported": report.status},
            )
        return current, False
    params = {
        "project_id": project_id,
        "id": current.id,
        "status": report.status,
        "provider_message_id": report.provider_message_id,
        "error": report.error if report.status == "FAILED" else None,
        "error_code": report.error_code if report.status == "FAILED" else None,
        "now": now,
    }
    with conn.cursor(row_factory=class_row(MessageState)) as cur:
        updated = cur.execute(QUERIES["set_message_status"], params).fetchone()
    assert updated is not None
    event = STATUS_REPORTED[updated.status](
        message_id=updated.id,
        status=updated.status,
        provider_message_id=updated.provider_message_id,
        error=updated.error,
        followup_enrollment_id=updated.followup_enrollment_id,
    )
    if isinstance(event, MessageFailed):
        event = msgspec.structs.replace(event, error_code=updated.error_code)
    write_events(conn, project_id, [event], occurred_at=now)
    return updated, True


def report_sent(
    conn: Connection[Any], project_id: uuid.UUID, sent: list[tuple[uuid.UUID, str]], *, now: datetime
) -> list[uuid.UUID]:
    """Many messages of the project SENT at once (the send lane's batch), each with the provider's id, its
    status event and its ``message.sent``; returns those it moved (one whose status moved on meanwhile, a
    status webhook having come first, is left as it is: the reports are monotonic)."""
    if not sent:
        return []
    params = {
        "project_id": project_id,
        "ids": [message_id for message_id, _ in sent],
        "provider_ids": [provider_id for _, provider_id in sent],
        "now": now,
    }
    rows = conn.execute(QUERIES["set_messages_sent"], params).fetchall()
    events = [
        MessageSent(
            message_id=message_id,
            status="SENT",
            provider_message_id=provider_id,
            error=None,
            followup_enrollment_id=enrollment_id,
        )
        for message_id, provider_id, enrollment_id in rows
    ]
    write_events(conn, project_id, events, occurred_at=now)
    return [event.message_id for event in events]


class SentMessage(MessageState, kw_only=True, frozen=True):
    """A SENT message, with when it was queued."""

    created_at: datetime


def rate_limited_message(
    conn: Connection[Any], project_id: uuid.UUID, report: StatusReport
) -> SentMessage | None:
    """The SENT message a rate-limit failure (``report``) is about: by our id or the provider's, and when the
    report names the provider's id, only the attempt it names (None: the report is applied as any other)."""
    params = {
        "project_id": project_id,
        "id": report.message_id,
        "provider_message_id": report.provider_message_id,
    }
    with conn.cursor(row_factory=class_row(SentMessage)) as cur:
        return cur.execute(QUERIES["rate_limited_message"], params).fetchone()


def requeue_message(
    conn: Connection[Any],
    project_id: uuid.UUID,
    message_id: uuid.UUID,
    report: StatusReport,
    *,
    action: str,
    most: int,
    now: datetime,
) -> MessageState | None:
    """A SENT message the provider then failed for its number's rate limit (``report``), QUEUED again for
    the send lane, its status event keeping the report's error and ``action``; None when the message is no
    longer SENT, or was queued again so (``action``) ``most`` times already (then the report is applied as
    any other)."""
    params = {
        "project_id": project_id,
        "id": message_id,
        "detail": report.error or report.error_code,
        "action": action,
        "most": most,
        "now": now,
    }
    with conn.cursor(row_factory=class_row(MessageState)) as cur:
        return cur.execute(QUERIES["requeue_message"], params).fetchone()


def record_action(
    conn: Connection[Any],
    project_id: uuid.UUID,
    message_id: uuid.UUID,
    *,
    detail: str,
    action: str,
    now: datetime,
) -> None:
    """What the engine did about the message's failure, in its timeline (a status event of its status)."""
    params = {"project_id": project_id, "id": message_id, "detail": detail, "action": action, "now": now}
    conn.execute(QUERIES["record_action"], params)


def _moves_forward(current: str, reported: str) -> bool:
    if current in FINAL:
        return False
    if reported == "FAILED":
        return current in ("QUEUED", "PROCESSING", "SENT")
    return RANK[reported] > RANK.get(current, len(RANK))
