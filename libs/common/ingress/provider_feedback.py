"""What a provider's failure changes (docs/providers.md, "What a failure changes"): a ``message.status``
``FAILED`` with an ``error_code`` is classed (:func:`libs.common.platform.provider_errors.classify`) and
each class acts, in the status event's transaction:

    marketing_limit         131049: the contact's marketing follow-ups wait 24 h (``user_marketing_limit``)
    outside_service_window  131047, 470, 63016: the follow-up's step retried once as its approved template,
                            or skipped (``outside_service_window``)
    undeliverable           131026, 63003, 21211: the contact flagged, its follow-ups stopped
                            (``undeliverable``)
    rate_limit              130429: a SENT message QUEUED again, its number's pacing widened
                            (:mod:`libs.common.followups.pacing`)
    other                   recorded and counted, nothing else

Each action is in the message's timeline (a status event with its ``action``), on the event's result, in
the log line, and counted once the transaction committed in ``followups_provider_errors_total``.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any, Final

from psycopg import Connection

from libs.common.core.effects import Observe, after_commit
from libs.common.core.metrics import PROVIDER_ERRORS
from libs.common.core.reasons import ProviderAction, ProviderErrorClass, stored
from libs.common.followups import enrollments, pacing
from libs.common.followups.provider_feedback import retry_as_template
from libs.common.ingress.apply import EventResult, stop
from libs.common.platform import contacts
from libs.common.platform.provider_errors import classify
from libs.common.platform.send_lane import (
    MessageState,
    StatusReport,
    rate_limited_message,
    record_action,
    requeue_message,
)

log = logging.getLogger(__name__)

#: How long the contact's marketing follow-ups wait after the provider's per-user marketing limit.
MARKETING_LIMIT_WAIT: Final = timedelta(hours=24)
#: How many times a message is queued again for rate limits: a report repeated by our id alone (a
#: redelivery, a late report of an earlier attempt) cannot send it again and again.
RATE_LIMIT_REQUEUES: Final = 3


def requeue_rate_limited(
    conn: Connection[Any], project_id: uuid.UUID, report: StatusReport, *, now: datetime
) -> EventResult | None:
    """A ``FAILED`` for the number's rate limit of a SENT message: QUEUED again and the number's pacing
    widened (None when the report is no such thing: it is applied as any other)."""
    if report.status != "FAILED" or classify(report.error_code) != "rate_limit":
        return None
    sent = rate_limited_message(conn, project_id, report)
    if sent is None:
        return None
    # sent again only while it may still go: the contact has not replied, opted out or been erased or
    # flagged since it was queued (share-locked: a stop path in flight is waited for), and its follow-up was
    # not stopped or paused; else the failure is applied as any other (FAILED, the number paced)
    if not contacts.share_reachable(conn, project_id, sent.contact_id, since=sent.created_at):
        return None
    if sent.followup_enrollment_id is not None and not enrollments.still_sending(
        conn, project_id, sent.followup_enrollment_id
    ):
        return None
    state = requeue_message(
        conn, project_id, sent.id, report, action="requeued", most=RATE_LIMIT_REQUEUES, now=now
    )
    if state is None:
        return None
    result = EventResult(
        type="message.status",
        message_id=state.id,
        status=state.status,
        contact_id=state.contact_id,
        conversation_id=state.conversation_id,
    )
    _acted(conn, project_id, state, "rate_limit", "requeued", _widen(conn, project_id, state, now), result)
    return result


def act(
    conn: Connection[Any], project_id: uuid.UUID, state: MessageState, result: EventResult, *, now: datetime
) -> None:
    """What the failure of ``state`` (FAILED just now, with its error code) changes, by its class."""
    code_class = classify(state.error_code)
    action: ProviderAction = "recorded"
    detail: str | None = None
    if code_class == "marketing_limit":
        until = now + MARKETING_LIMIT_WAIT
        contacts.limit_marketing(conn, project_id, state.contact_id, until=until)
        action, detail = "marketing_deferred", until.isoformat()
    elif code_class == "outside_service_window":
        action, detail = retry_as_template(conn, project_id, state.id, now=now)
    elif code_class == "undeliverable":
        contacts.lock_contact(conn, project_id, state.contact_id)
        contacts.flag_undeliverable(conn, project_id, state.contact_id, now=now)
        stop(conn, project_id, state.contact_id, "undeliverable", now, result)
        action, detail = "contact_undeliverable", str(len(result.stopped_enrollment_ids))
    elif code_class == "rate_limit":  # not SENT (its send not settled): failed, but the number is paced
        detail = _widen(conn, project_id, state, now)
    record_action(conn, project_id, state.id, detail=code_class, action=stored(action, detail), now=now)
    _acted(conn, project_id, state, code_class, action, detail, result)


def _widen(conn: Connection[Any], project_id: uuid.UUID, state: MessageState, now: datetime) -> str | None:
    """The message's number rate-limited: its pacing widened; the new gap in ms (None without a number)."""
    if state.number_id is None:
        return None
    return str(pacing.widen(conn, project_id, state.number_id, now=now))


def _acted(
    conn: Connection[Any],
    project_id: uuid.UUID,
    state: MessageState,
    code_class: ProviderErrorClass,
    action: ProviderAction,
    detail: str | None,
    result: EventResult,
) -> None:
    result.provider_action = stored(action, detail)
    after_commit(conn, Observe("provider error", lambda: PROVIDER_ERRORS.labels(code_class).inc()))
    log.info(
        "provider error acted on",
        extra={
            "project_id": str(project_id),
            "message_id": str(state.id),
            "contact_id": str(state.contact_id),
            "number_id": str(state.number_id) if state.number_id else None,
            "error_code": state.error_code,
            "code_class": code_class,
            "action": action,
            "detail": detail,
        },
    )
