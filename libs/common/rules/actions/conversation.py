"""The actions on the event's conversation (else the contact's open one): labels, assignment, status,
priority, snooze and a private note."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import MAX_NOTE_LENGTH, NOT_BLANK_TEXT, Note, Tag
from libs.common.contracts.platform_events import ConversationStatus
from libs.common.core import validation
from libs.common.core.errors import InvalidInput
from libs.common.followups.stops import stop_followups_for_contact
from libs.common.platform import contacts, conversations
from libs.common.platform.conversations import ConversationChange, Priority
from libs.common.rules.actions.base import (
    ITEMS_BOUNDS,
    Assignee,
    BaseAction,
    Check,
    Done,
    Subject,
    check_assignee,
    check_items,
    conversation_of,
    executed_by,
    form,
)

#: Longest snooze (30 days), in minutes.
MAX_SNOOZE_MINUTES = 43_200

#: The labels of a label action's input.
_LABELS = form("Labels (comma separated)")


class _Change(BaseAction, kw_only=True):
    """An action that is one change of the conversation (:class:`ConversationChange`)."""

    def change(self) -> ConversationChange:
        raise NotImplementedError

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> Check:
        conversation_id = conversation_of(conn, subject)
        return conversations.send_conversation_change(
            conn, subject.project_id, conversation_id, self.change(), now=now
        )


class AddLabel(_Change, kw_only=True, tag="add_label"):
    """Add labels to the conversation."""

    labels: Annotated[list[Tag], _LABELS, ITEMS_BOUNDS]

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        check_items(self.labels, "labels", where)

    def change(self) -> ConversationChange:
        return ConversationChange(add_labels=self.labels)


class RemoveLabel(_Change, kw_only=True, tag="remove_label"):
    """Remove labels from the conversation."""

    labels: Annotated[list[Tag], _LABELS, ITEMS_BOUNDS]

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        check_items(self.labels, "labels", where)

    def change(self) -> ConversationChange:
        return ConversationChange(remove_labels=self.labels)


class AssignAgent(_Change, kw_only=True, tag="assign_agent"):
    """Assign the conversation to an agent (null: unassign)."""

    assignee: Annotated[Assignee | None, form("Agent (empty: unassign)")]

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        check_assignee(self.assignee, "assignee", where)

    def change(self) -> ConversationChange:
        return ConversationChange(assignee=self.assignee)


class AssignTeam(_Change, kw_only=True, tag="assign_team"):
    """Assign the conversation to a team (null: none)."""

    team: Annotated[Assignee | None, form("Team (empty: none)")]

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        check_assignee(self.team, "team", where)

    def change(self) -> ConversationChange:
        return ConversationChange(team=self.team)


class ChangePriority(_Change, kw_only=True, tag="change_priority"):
    """Set the conversation's priority (null: none)."""

    priority: Annotated[Priority | None, form("Priority")]

    def change(self) -> ConversationChange:
        return ConversationChange(priority=self.priority)


class ChangeStatus(BaseAction, kw_only=True, tag="change_status"):
    """A new status; resolving the conversation runs the conversation-resolved stop path, as when an agent
    resolves it (the contact is locked first: contact, then conversation, as everywhere)."""

    status: Annotated[ConversationStatus, form("Status")]

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> None:
        conversation_id = conversation_of(conn, subject)
        if self.status == "resolved":
            contacts.lock_contact(conn, subject.project_id, subject.contact_id)
        _, previous = conversations.change_status(
            conn, subject.project_id, conversation_id, self.status, now=now
        )
        if self.status == "resolved" and previous != "resolved":
            done.stopped.append(
                stop_followups_for_contact(
                    conn,
                    subject.project_id,
                    subject.contact_id,
                    "conversation_resolved",
                    now=now,
                    conversation_id=conversation_id,
                )
            )


class SnoozeUntil(BaseAction, kw_only=True, tag="snooze_until"):
    """Snooze the conversation for ``minutes`` from when the action runs."""

    minutes: Annotated[int, msgspec.Meta(ge=1, le=MAX_SNOOZE_MINUTES), form("Minutes")]

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> None:
        conversation_id = conversation_of(conn, subject)
        until = now + timedelta(minutes=self.minutes)
        conversations.change_status(
            conn, subject.project_id, conversation_id, "snoozed", now=now, snoozed_until=until
        )


class AddPrivateNote(BaseAction, kw_only=True, tag="add_private_note"):
    """Add a private note to the conversation (agents see it; the contact does not)."""

    #: Not blank (checked with the action; the schema documents it).
    text: Annotated[
        Note,
        form("Note", widget="textarea"),
        NOT_BLANK_TEXT,
    ]

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        if not 1 <= len(validation.text(self.text.strip(), f"{where}.text")) <= MAX_NOTE_LENGTH:
            raise InvalidInput(f"text must be 1 to {MAX_NOTE_LENGTH} characters", field=f"{where}.text")

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> None:
        conversations.add_private_note(
            conn,
            subject.project_id,
            subject.contact_id,
            conversation_of(conn, subject),
            self.text,
            executed_by=executed_by(rule_id),
            now=now,
        )
