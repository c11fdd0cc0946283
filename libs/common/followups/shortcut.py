"""The conversation follow-up shortcut: "in 24 hours, if there is no reply, send this", as a one-off
follow-up for the conversation's contact, threaded into that conversation."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import NOT_BLANK_TEXT, DedupeKey, MediaUrl, MessageText, Variables
from libs.common.core import validation
from libs.common.core.errors import InvalidInput, Refusals
from libs.common.followups.definition import (
    MAX_DELAY_SECONDS,
    Definition,
    MessageStep,
    NonNegative,
    StopFlags,
)
from libs.common.followups.enrollments import EnrollRequest, enroll
from libs.common.followups.sequences import check_one_off
from libs.common.followups.transitions import Enrollment
from libs.common.platform.conversations import Conversation, get_conversation


class FollowUpRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A one-off follow-up in a conversation: after ``delay_seconds``, send ``text`` (unless a reply came)."""

    #: Not blank: a one-off is published at once, and a published step has something to say (checked then,
    #: naming ``text``; the schema documents it).
    text: Annotated[MessageText, NOT_BLANK_TEXT]
    delay_seconds: NonNegative = 86400
    only_if_no_reply: bool = True
    media_url: MediaUrl | None = None
    media_kind: Literal["image", "video", "audio", "document"] | None = None
    variables: Variables = msgspec.field(default_factory=dict)
    dedupe_key: DedupeKey | None = None


#: Where the one-off's only step reports its fields; the request names them without it.
_STEP_FIELD = "steps.0."


def follow_up(
    conn: Connection[Any],
    project_id: uuid.UUID,
    conversation_id: uuid.UUID,
    request: FollowUpRequest,
    *,
    now: datetime,
) -> tuple[Enrollment, bool]:
    """A one-off follow-up for the conversation's contact, threaded into this conversation."""
    if not 0 <= request.delay_seconds <= MAX_DELAY_SECONDS:
        raise InvalidInput(f"delay_seconds must be 0 to {MAX_DELAY_SECONDS}", field="delay_seconds")
    conversation = get_conversation(conn, project_id, conversation_id)
    try:
        return _enroll_one_off(conn, project_id, conversation, request, now=now)
    except InvalidInput as exc:
        if exc.field is not None and exc.field.startswith(_STEP_FIELD):
            raise _request_fields(exc) from None
        raise


def check_follow_up(request: FollowUpRequest) -> None:
    """The checks of a request's one-off that need nothing stored (its step as published, its variables),
    every error at once, naming the request's fields."""
    refusals = Refusals()
    with refusals.check():
        check_one_off(Definition(steps=[_one_off_step(request)], stop_on=_stop_flags(request)))
    with refusals.check():
        validation.keyed(request.variables, "variables")
    if refusals.errors:
        raise _request_fields(InvalidInput.every(refusals.errors))


def _request_fields(exc: InvalidInput) -> InvalidInput:
    """The one-off's only step is the request: its errors name the request's fields (``text``), not
    ``steps.0.text``."""
    return type(exc).every([(field.removeprefix(_STEP_FIELD), message) for field, message in exc.errors])


def _one_off_step(request: FollowUpRequest) -> MessageStep:
    return MessageStep(
        text=request.text,
        delay_seconds=request.delay_seconds,
        media_url=request.media_url,
        media_kind=request.media_kind,
        only_if=["no_reply_since_enrollment"] if request.only_if_no_reply else [],
    )


def _stop_flags(request: FollowUpRequest) -> StopFlags:
    return StopFlags(reply=request.only_if_no_reply)


def _enroll_one_off(
    conn: Connection[Any],
    project_id: uuid.UUID,
    conversation: Conversation,
    request: FollowUpRequest,
    *,
    now: datetime,
) -> tuple[Enrollment, bool]:
    return enroll(
        conn,
        project_id,
        EnrollRequest(
            contact_id=conversation.contact_id,
            steps=[_one_off_step(request)],
            stop_on=_stop_flags(request),
            conversation_id=conversation.id,
            number_id=conversation.number_id,
            variables=request.variables,
            dedupe_key=request.dedupe_key,
        ),
        now=now,
        source="conversation",
    )
