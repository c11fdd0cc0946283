"""The conversation follow-up shortcut: "in 24 hours, if there is no reply, send this", as a one-off
follow-up for the conversation's contact, threaded into that conversation."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import NOT_BLANK_TEXT, DedupeKey, MediaUrl, MessageText, Variables
from libs.common.core.errors import InvalidInput
from libs.common.followups.definition import MAX_DELAY_SECONDS, MessageStep, NonNegative, StopFlags
from libs.common.followups.enrollments import EnrollRequest, enroll
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
        # the one-off's only step is this request: name its fields (``text``), not ``steps.0.text``
        if exc.field is not None and exc.field.startswith(_STEP_FIELD):
            raise type(exc)(exc.message, field=exc.field.removeprefix(_STEP_FIELD)) from None
        raise


def _enroll_one_off(
    conn: Connection[Any],
    project_id: uuid.UUID,
    conversation: Conversation,
    request: FollowUpRequest,
    *,
    now: datetime,
) -> tuple[Enrollment, bool]:
    step = MessageStep(
        text=request.text,
        delay_seconds=request.delay_seconds,
        media_url=request.media_url,
        media_kind=request.media_kind,
        only_if=["no_reply_since_enrollment"] if request.only_if_no_reply else [],
    )
    return enroll(
        conn,
        project_id,
        EnrollRequest(
            contact_id=conversation.contact_id,
            steps=[step],
            stop_on=StopFlags(reply=request.only_if_no_reply),
            conversation_id=conversation.id,
            number_id=conversation.number_id,
            variables=request.variables,
            dedupe_key=request.dedupe_key,
        ),
        now=now,
        source="conversation",
    )
