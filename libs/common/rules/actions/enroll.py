"""The action that enrolls the event's contact in a sequence."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import KEY_BOUNDS, MAX_VARIABLES
from libs.common.core import validation
from libs.common.core.errors import InvalidInput, NotFound
from libs.common.followups.enrollments import EnrollRequest, enroll
from libs.common.followups.sequences import get_sequence
from libs.common.platform import contacts
from libs.common.rules.actions.base import ActionRejected, BaseAction, Done, Subject, form

#: The prefix of an anchor read from a contact attribute.
ATTRIBUTE_ANCHOR = "contact.attributes."


class EnrollInSequence(BaseAction, kw_only=True, tag="enroll_in_sequence"):
    """Enroll the event's contact in a sequence. ``anchor``: none, the event's time, or a contact attribute
    holding an ISO 8601 time (``contact.attributes.appointment_at``). ``variables`` are the enrollment's
    template variables; the event's own (``event_type``, ``tag``, ``message_content``, ...) are added."""

    sequence_id: Annotated[uuid.UUID, form("Sequence", widget="select:sequences")]
    anchor: Annotated[str, form("Anchor (none, event_time or contact.attributes.<key>)")] = "none"
    variables: Annotated[
        dict[str, str],
        form("Variables (key=value, one a line)"),
        msgspec.Meta(max_length=MAX_VARIABLES, extra_json_schema={"propertyNames": KEY_BOUNDS}),
    ] = msgspec.field(default_factory=dict)

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        try:
            get_sequence(conn, project_id, self.sequence_id)
        except NotFound:
            raise NotFound("sequence not found", field=f"{where}.sequence_id") from None
        if self.anchor not in ("none", "event_time") and not (
            self.anchor.startswith(ATTRIBUTE_ANCHOR) and len(self.anchor) > len(ATTRIBUTE_ANCHOR)
        ):
            raise InvalidInput(
                "anchor is none, event_time or contact.attributes.<key>", field=f"{where}.anchor"
            )
        validation.keyed(self.variables, f"{where}.variables")

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> None:
        variables: dict[str, Any] = {"event_type": subject.type}
        for key in ("tag", "status", "stage"):
            if isinstance(subject.payload.get(key), str):
                variables[key] = subject.payload[key]
        message = subject.payload.get("message")
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            variables["message_content"] = message["content"]
        variables |= self.variables
        request = EnrollRequest(
            contact_id=subject.contact_id,
            sequence_id=self.sequence_id,
            variables=variables,
            anchor_at=self._anchor_at(conn, subject),
            conversation_id=subject.conversation_id,
        )
        enroll(conn, subject.project_id, request, now=now, source="rule")  # registers the release nudge

    def _anchor_at(self, conn: Connection[Any], subject: Subject) -> datetime | None:
        if self.anchor == "none":
            return None
        if self.anchor == "event_time":
            return subject.occurred_at
        key = self.anchor.removeprefix(ATTRIBUTE_ANCHOR)
        contact = contacts.get_contact(conn, subject.project_id, subject.contact_id)
        raw = contact.attributes.get(key)
        try:
            value = datetime.fromisoformat(raw) if isinstance(raw, str) else None
        except ValueError:
            value = None
        if value is None or value.tzinfo is None:
            raise ActionRejected(
                "missing_anchor", f"contact attribute {key} holds no ISO 8601 time with an offset"
            )
        return value
