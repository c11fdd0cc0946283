"""The shared language between services: queues, actor names and their msgspec payloads.

A service never imports another; it sends a Dramatiq message by queue and actor name with a payload
defined here (:func:`send`), and the receiving service declares its actor under the same name
(:func:`actor_options`). Payloads are encoded to plain builtins, so a message is readable JSON on the wire.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

import dramatiq
import msgspec

from libs.common.contracts.platform_events import PlatformEvent


class Payload(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every message payload."""


P = TypeVar("P", bound=Payload)


@dataclass(frozen=True)
class Contract(Generic[P]):
    """One actor: the queue it listens on, its name, and the payload it takes."""

    queue: str
    actor: str
    payload: type[P]

    def decode(self, message: dict[str, Any]) -> P:
        """Validate a received payload; raises msgspec.ValidationError on a malformed one."""
        return msgspec.convert(message, self.payload)


#: Most messages one send-lane claim returns.
MAX_CLAIM = 500

#: Queues, one per service.
RELEASE_QUEUE = "followups.release"
TRIGGERS_QUEUE = "followups.triggers"
AI_STEPS_QUEUE = "followups.ai_steps"
RETENTION_QUEUE = "followups.retention"
INGRESS_QUEUE = "followups.ingress"
#: The send lane's (no actor listens on it yet: its loop polls).
SEND_LANE_QUEUE = "followups.send_lane"


class ReleaseNudge(Payload):
    """An enrollment became due now: wake the release loop instead of waiting for its next poll."""

    project_id: uuid.UUID
    enrollment_id: uuid.UUID


#: Sent by anything that makes an enrollment due now (enroll, resume); consumed by the release service.
RELEASE_NUDGE = Contract(RELEASE_QUEUE, "release_nudge", ReleaseNudge)


class AiStepDue(Payload):
    """An AI step was leased for its model call: write the message, then run the second pass fenced on
    ``fence`` (the enrollment's attempts when it was leased)."""

    project_id: uuid.UUID
    enrollment_id: uuid.UUID
    step_index: int
    fence: int


#: Sent by the release service after it leased an AI step; consumed by the ai_steps service.
AI_STEP = Contract(AI_STEPS_QUEUE, "ai_step", AiStepDue)


class TriggersNudge(Payload):
    """Triggers were recorded (or webhook deliveries queued): wake the triggers service's loops."""

    project_id: uuid.UUID


#: Sent after a commit that recorded triggers; consumed by the triggers service.
TRIGGERS_NUDGE = Contract(TRIGGERS_QUEUE, "triggers_nudge", TriggersNudge)


class PlatformEventMessage(Payload):
    """A platform event for a project (the same events ``POST /v1/events`` takes)."""

    project_id: uuid.UUID
    event: PlatformEvent


#: Platform events fed over RabbitMQ; consumed by the ingress service.
PLATFORM_EVENT = Contract(INGRESS_QUEUE, "platform_event", PlatformEventMessage)


class ClaimMessages(Payload):
    """The send lane asks for QUEUED messages; each claimed one is announced by ``message.claimed``."""

    project_id: uuid.UUID | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_CLAIM)] = 50
    number_id: uuid.UUID | None = None


#: The send lane's claim over RabbitMQ; consumed by the ingress service.
CLAIM_MESSAGES = Contract(INGRESS_QUEUE, "claim_messages", ClaimMessages)


def send(broker: dramatiq.Broker, contract: Contract[P], payload: P) -> None:
    """Enqueue ``payload`` for the actor named by ``contract``, without importing its service."""
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=contract.queue,
        actor_name=contract.actor,
        args=(msgspec.to_builtins(payload),),
        kwargs={},
        options={},
    )
    broker.enqueue(message)


def actor_options(contract: Contract[Any]) -> dict[str, Any]:
    """Keyword arguments for ``dramatiq.actor`` that bind a function to ``contract``.

    A message that fails is not retried by Dramatiq: the work it stands for lives in PostgreSQL and the
    loops retry it there; a malformed payload goes to the dead-letter queue at once.
    """
    return {"actor_name": contract.actor, "queue_name": contract.queue, "max_retries": 0}
