"""Ingress actors: platform events and send-lane claims over RabbitMQ, calling the same domain functions
as the REST API. A malformed or rejected message is logged with its reason and dead-lettered; it never
crashes the worker and never half-applies (decoding happens before any transaction opens, and each event
is applied in one transaction that a failure rolls back). A reply is the exception that fails closed: one
that cannot be applied still stops its contact's follow-ups, in a transaction of its own, before it is
dead-lettered (see :func:`libs.common.ingress.handle_event`).

A platform event that fails only because the database is unreachable is retried with backoff instead:
dead-lettering it would lose a reply, and with it the stop of the contact's follow-ups.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
import msgspec

from libs.common.contracts import actors
from libs.common.core.db import map_errors
from libs.common.core.errors import Busy, DatabaseUnavailable, FollowupsError
from libs.common.core.runtime import Runtime, Service
from libs.common.ingress import handle_event
from libs.common.platform.send_lane import ClaimRequest, claim_messages

log = logging.getLogger(__name__)

#: How often a platform event is retried while the database is unreachable, and the backoff bounds (ms).
TRANSIENT_RETRIES = 10
MIN_BACKOFF_MS = 1_000
MAX_BACKOFF_MS = 60_000


class Rejected(Exception):
    """An ingress message that cannot be applied; it goes to the dead-letter queue."""


class Deferred(dramatiq.Retry):
    """The database is out of reach, or a row the event needs is held a moment: the event is tried again
    later (a ``Retry``, so Dramatiq does not log a traceback per message; an outage itself is logged once,
    by the pool's side)."""


def retry_when(retries: int, exception: BaseException) -> bool:
    """Retry only transient failures (the database unreachable, a row held), a bounded number of times."""
    return isinstance(exception, Deferred) and retries < TRANSIENT_RETRIES


def build(runtime: Runtime) -> Service:
    def platform_event(payload: dict[str, Any]) -> None:
        message = _decode(actors.PLATFORM_EVENT, payload)
        context = {"project_id": str(message.project_id), "event_type": _event_type(message.event)}
        try:
            handle_event(
                runtime, message.project_id, message.event, now=runtime.clock.now(), check_project=True
            )
        except DatabaseUnavailable as exc:
            log.debug("ingress event deferred: database unavailable", extra=context)
            raise Deferred("database unavailable") from exc
        except Busy as exc:  # a row it needs is held a moment (the contact's open conversation)
            log.info("ingress event deferred: busy", extra=context | {"reason": exc.message})
            raise Deferred("busy") from exc
        except FollowupsError as exc:
            log.error("ingress event rejected", extra=context | {"reason": exc.message, "field": exc.field})
            raise Rejected(exc.message) from exc
        except Exception as exc:  # a constraint or a bug: retrying would fail the same way
            log.exception("ingress event failed", extra=context | {"reason": str(exc), "field": None})
            raise Rejected(str(exc)) from exc

    def claim(payload: dict[str, Any]) -> None:
        message = _decode(actors.CLAIM_MESSAGES, payload)
        request = ClaimRequest(limit=message.limit, number_id=message.number_id)
        with map_errors(), runtime.pool.connection() as conn:
            claim_messages(conn, message.project_id, request, now=runtime.clock.now())

    event_options = {"retry_when": retry_when, "min_backoff": MIN_BACKOFF_MS, "max_backoff": MAX_BACKOFF_MS}
    dramatiq.actor(broker=runtime.broker, **actors.actor_options(actors.PLATFORM_EVENT) | event_options)(
        platform_event
    )
    dramatiq.actor(broker=runtime.broker, **actors.actor_options(actors.CLAIM_MESSAGES))(claim)
    return Service("ingress", actors.INGRESS_QUEUE)


def _event_type(event: Any) -> str:
    return str(type(event).__struct_config__.tag)


def _decode(contract: actors.Contract[actors.P], payload: Any) -> actors.P:
    try:
        return contract.decode(payload)
    except (msgspec.ValidationError, TypeError) as exc:
        log.error("malformed ingress message", extra={"actor": contract.actor, "reason": str(exc)})
        raise Rejected(f"malformed {contract.actor} message: {exc}") from exc
