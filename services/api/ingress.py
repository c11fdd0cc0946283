"""Ingress actors: platform events and send-lane claims over RabbitMQ, calling the same domain functions
as the REST API. A malformed or rejected message is logged with its reason and dead-lettered; it never
crashes the worker and never half-applies (decoding happens before any transaction opens)."""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
import msgspec

from libs.common import contracts
from libs.common.errors import FollowupsError
from libs.common.platform_events import apply_event
from libs.common.runtime import Runtime, Service
from libs.common.send_lane import ClaimRequest, claim_messages

log = logging.getLogger(__name__)


class Rejected(Exception):
    """An ingress message that cannot be applied; it goes to the dead-letter queue."""


def build(runtime: Runtime) -> Service:
    def platform_event(payload: dict[str, Any]) -> None:
        message = _decode(contracts.PLATFORM_EVENT, payload)
        try:
            with runtime.pool.connection() as conn:
                apply_event(conn, message.project_id, message.event, now=runtime.clock.now())
        except FollowupsError as exc:
            log.error(
                "ingress event rejected",
                extra={"project_id": str(message.project_id), "reason": exc.message, "field": exc.field},
            )
            raise Rejected(exc.message) from exc

    def claim(payload: dict[str, Any]) -> None:
        message = _decode(contracts.CLAIM_MESSAGES, payload)
        request = ClaimRequest(limit=message.limit, number_id=message.number_id)
        with runtime.pool.connection() as conn:
            claim_messages(conn, message.project_id, request, now=runtime.clock.now())

    for contract, function in ((contracts.PLATFORM_EVENT, platform_event), (contracts.CLAIM_MESSAGES, claim)):
        dramatiq.actor(broker=runtime.broker, **contracts.actor_options(contract))(function)
    return Service("ingress", contracts.INGRESS_QUEUE)


def _decode(contract: contracts.Contract[contracts.P], payload: Any) -> contracts.P:
    try:
        return contract.decode(payload)
    except (msgspec.ValidationError, TypeError) as exc:
        log.error("malformed ingress message", extra={"actor": contract.actor, "reason": str(exc)})
        raise Rejected(f"malformed {contract.actor} message: {exc}") from exc
