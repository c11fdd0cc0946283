"""Domain events: one struct per outbox event type, the ``data`` of the envelope published for it.

Every event is written through :func:`libs.common.core.outbox.write_events` with one of these structs, so
a payload cannot drift from ``docs/events.md`` (a test holds the two, and every row a scenario run
writes, against each other). Consumers may decode ``data`` with the same struct.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

import msgspec


class Event(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Base of every domain event: its ``type`` (the routing key) and the aggregate it belongs to."""

    type: ClassVar[str]
    aggregate_type: ClassVar[str]

    @property
    def aggregate_id(self) -> uuid.UUID:
        raise NotImplementedError


class MessageEvent(Event, kw_only=True, frozen=True):
    aggregate_type: ClassVar[str] = "message"

    message_id: uuid.UUID

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.message_id


class MessageQueued(MessageEvent, kw_only=True, frozen=True):
    """A message was queued for the send lane (QUEUED)."""

    type: ClassVar[str] = "message.queued"

    conversation_id: uuid.UUID
    contact_id: uuid.UUID
    number_id: uuid.UUID | None
    source: str
    priority: int
    followup_enrollment_id: uuid.UUID | None


class MessageClaimed(MessageEvent, kw_only=True, frozen=True):
    """The send lane claimed a message (PROCESSING): what it needs to send it."""

    type: ClassVar[str] = "message.claimed"

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
    template_name: str | None
    template_language: str | None
    template_parameters: list[str] | None


class MessageStatusReported(MessageEvent, kw_only=True, frozen=True):
    """The send lane reported progress."""

    status: str
    provider_message_id: str | None
    error: str | None
    followup_enrollment_id: uuid.UUID | None


class MessageSent(MessageStatusReported, kw_only=True, frozen=True):
    type: ClassVar[str] = "message.sent"


class MessageDelivered(MessageStatusReported, kw_only=True, frozen=True):
    type: ClassVar[str] = "message.delivered"


class MessageRead(MessageStatusReported, kw_only=True, frozen=True):
    type: ClassVar[str] = "message.read"


class MessageFailed(MessageEvent, kw_only=True, frozen=True):
    """The send lane reported a failure (``status`` FAILED, ``error``), or a stop path cancelled a queued
    follow-up (``reason`` CANCELLED, ``stop_reason``)."""

    type: ClassVar[str] = "message.failed"

    followup_enrollment_id: uuid.UUID | None
    status: str | None = None
    provider_message_id: str | None = None
    error: str | None = None
    #: The provider's code of the failure (docs/providers.md), when the send lane knows one.
    error_code: str | None = None
    reason: str | None = None
    stop_reason: str | None = None
    contact_id: uuid.UUID | None = None
    conversation_id: uuid.UUID | None = None


class MessageReceived(MessageEvent, kw_only=True, frozen=True):
    """A contact's message arrived."""

    type: ClassVar[str] = "message.received"

    contact_id: uuid.UUID
    conversation_id: uuid.UUID


class MessageHuman(MessageEvent, kw_only=True, frozen=True):
    """An agent's message was recorded."""

    type: ClassVar[str] = "message.human"

    contact_id: uuid.UUID
    conversation_id: uuid.UUID


class EnrollmentEvent(Event, kw_only=True, frozen=True):
    aggregate_type: ClassVar[str] = "followup_enrollment"

    enrollment_id: uuid.UUID
    sequence_id: uuid.UUID | None
    contact_id: uuid.UUID

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.enrollment_id


class StepQueued(EnrollmentEvent, kw_only=True, frozen=True):
    """A follow-up step's message was queued (``reason``: why a fallback text was used, or null)."""

    type: ClassVar[str] = "followup.step_queued"

    step_index: int
    message_id: uuid.UUID
    reason: str | None


class StepSkipped(EnrollmentEvent, kw_only=True, frozen=True):
    """A step was skipped; ``reason`` says why."""

    type: ClassVar[str] = "followup.step_skipped"

    step_index: int
    reason: str


class EnrollmentFinished(EnrollmentEvent, kw_only=True, frozen=True):
    """An enrollment finished; ``reason`` says why (null for a completed one)."""

    reason: str | None


class EnrollmentCompleted(EnrollmentFinished, kw_only=True, frozen=True):
    type: ClassVar[str] = "followup.completed"


class EnrollmentStopped(EnrollmentFinished, kw_only=True, frozen=True):
    type: ClassVar[str] = "followup.stopped"


class EnrollmentFailed(EnrollmentFinished, kw_only=True, frozen=True):
    type: ClassVar[str] = "followup.failed"


class EnrollmentConverted(EnrollmentFinished, kw_only=True, frozen=True):
    """A goal of the sequence was met: the enrollment ended ``converted``, or (``late``) one that had
    finished converted inside its sequence's conversion window, its status kept."""

    type: ClassVar[str] = "followup.converted"

    goal: str
    #: The step the conversion is attributed to: the last one whose message was sent (null: none was).
    converted_step: int | None
    late: bool = False


class EnrollmentExited(EnrollmentFinished, kw_only=True, frozen=True):
    """An exit criterion of the sequence was met: the enrollment ended ``exited``."""

    type: ClassVar[str] = "followup.exited"

    exited_by: str


class ContactErased(Event, kw_only=True, frozen=True):
    """A contact was erased."""

    type: ClassVar[str] = "contact.erased"
    aggregate_type: ClassVar[str] = "contact"

    contact_id: uuid.UUID

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.contact_id


class BulkJobEvent(Event, kw_only=True, frozen=True):
    aggregate_type: ClassVar[str] = "bulk_job"

    job_id: uuid.UUID
    processed: int
    total: int
    enrolled: int
    #: Skipped contacts by reason.
    skipped: dict[str, int]

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.job_id


class BulkJobProgress(BulkJobEvent, kw_only=True, frozen=True):
    """A bulk enrollment moved on (at most one a second per job)."""

    type: ClassVar[str] = "bulk_job.progress"


class BulkJobCompleted(BulkJobEvent, kw_only=True, frozen=True):
    """A bulk enrollment finished: every contact handled (``completed``) or stopped (``cancelled``)."""

    type: ClassVar[str] = "bulk_job.completed"

    status: str


#: Every event type, by its ``type``.
EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        MessageQueued,
        MessageClaimed,
        MessageSent,
        MessageDelivered,
        MessageRead,
        MessageFailed,
        MessageReceived,
        MessageHuman,
        StepQueued,
        StepSkipped,
        EnrollmentCompleted,
        EnrollmentStopped,
        EnrollmentFailed,
        EnrollmentConverted,
        EnrollmentExited,
        ContactErased,
        BulkJobProgress,
        BulkJobCompleted,
    )
}

#: The finished-enrollment event of each final status.


FINISHED: dict[str, type[EnrollmentFinished]] = {
    "completed": EnrollmentCompleted,
    "stopped": EnrollmentStopped,
    "failed": EnrollmentFailed,
    "converted": EnrollmentConverted,
    "exited": EnrollmentExited,
}

#: The event of each status a send lane reports.
STATUS_REPORTED: dict[str, type[MessageSent | MessageDelivered | MessageRead | MessageFailed]] = {
    "SENT": MessageSent,
    "DELIVERED": MessageDelivered,
    "READ": MessageRead,
    "FAILED": MessageFailed,
}
