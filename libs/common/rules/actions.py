"""A rule's actions: a tagged union on ``type``, validated when the rule is saved, and run by the triggers
service for a matching trigger (in a savepoint of the rule's own).

Every change an action makes carries who made it (``executed_by``: ``rule:<id>``) and records no trigger:
rules never fire rules (the loop guard). A business refusal (an opted-out contact, an enrollment the
sequence refuses, no conversation to act on) raises :class:`ActionRejected` and is an outcome, not an error.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import MAX_NOTE_LENGTH, MessageText, Note, Url
from libs.common.contracts.platform_events import ConversationStatus
from libs.common.core import validation
from libs.common.core.errors import Conflict, FollowupsError, InvalidInput, NotFound
from libs.common.core.outbox import write_events
from libs.common.core.sql import load_queries
from libs.common.followups import project_settings
from libs.common.followups.constraints import outside_service_window
from libs.common.followups.definition import WhatsAppTemplate, check_whatsapp_template
from libs.common.followups.enrollments import EnrollmentRejected, EnrollRequest, enroll
from libs.common.followups.sequences import get_sequence
from libs.common.followups.stops import Stopped, stop_followups_for_contact
from libs.common.followups.templates import RenderContext, TemplateError, parse_template, render
from libs.common.platform import contacts, conversations
from libs.common.platform.conversations import ConversationChange, Priority
from libs.common.platform.messages import OutboundMessage, queue_contact_message
from libs.common.rules import webhooks

QUERIES = load_queries("libs.common.rules", "actions.sql")

#: Longest snooze (30 days), in minutes.
MAX_SNOOZE_MINUTES = 43_200
#: Most labels or tags one action changes.
MAX_ITEMS = 20


class _Action(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    pass


class EnrollInSequence(_Action, kw_only=True, tag="enroll_in_sequence"):
    """Enroll the event's contact in a sequence. ``anchor``: none, the event's time, or a contact attribute
    holding an ISO 8601 time (``contact.attributes.appointment_at``). ``variables`` are the enrollment's
    template variables; the event's own (``event_type``, ``tag``, ``message_content``, ...) are added."""

    sequence_id: uuid.UUID
    anchor: str = "none"
    variables: dict[str, str] = msgspec.field(default_factory=dict)


class SendMessage(_Action, kw_only=True, tag="send_message"):
    """Send a text (a template over the contact's fields) through the shared send path (source ``rule``),
    obeying opt-out, consent and the WhatsApp service window (outside it: ``whatsapp_template`` if given)."""

    text: MessageText
    whatsapp_template: WhatsAppTemplate | None = None


class AddLabel(_Action, kw_only=True, tag="add_label"):
    labels: list[str]


class RemoveLabel(_Action, kw_only=True, tag="remove_label"):
    labels: list[str]


class AddContactTag(_Action, kw_only=True, tag="add_contact_tag"):
    tags: list[str]


class RemoveContactTag(_Action, kw_only=True, tag="remove_contact_tag"):
    tags: list[str]


class AssignAgent(_Action, kw_only=True, tag="assign_agent"):
    """Assign the conversation to an agent (null: unassign)."""

    assignee: str | None


class AssignTeam(_Action, kw_only=True, tag="assign_team"):
    """Assign the conversation to a team (null: none)."""

    team: str | None


class ChangeStatus(_Action, kw_only=True, tag="change_status"):
    status: ConversationStatus


class ChangePriority(_Action, kw_only=True, tag="change_priority"):
    priority: Priority | None


class SnoozeUntil(_Action, kw_only=True, tag="snooze_until"):
    """Snooze the conversation for ``minutes`` from when the action runs."""

    minutes: Annotated[int, msgspec.Meta(ge=1, le=MAX_SNOOZE_MINUTES)]


class AddPrivateNote(_Action, kw_only=True, tag="add_private_note"):
    text: Note


class SendWebhook(_Action, kw_only=True, tag="send_webhook"):
    """POST the event as JSON to ``url``, signed (HMAC-SHA256), retried with backoff until delivered."""

    url: Url


Action = (
    EnrollInSequence
    | SendMessage
    | AddLabel
    | RemoveLabel
    | AddContactTag
    | RemoveContactTag
    | AssignAgent
    | AssignTeam
    | ChangeStatus
    | ChangePriority
    | SnoozeUntil
    | AddPrivateNote
    | SendWebhook
)

#: Most actions one rule may have.
MAX_ACTIONS = 20


def action_type(action: Action) -> str:
    kind = type(action).__struct_config__.tag
    assert isinstance(kind, str)
    return kind


# --- validation at save time -------------------------------------------------------------------------------


def validate_actions(conn: Connection[Any], project_id: uuid.UUID, actions: list[Action]) -> list[Action]:
    """Check every action against the project (its sequences) and its own rules; errors name
    ``actions.<i>.<field>``."""
    if not actions:
        raise InvalidInput("a rule needs at least one action", field="actions")
    if len(actions) > MAX_ACTIONS:
        raise InvalidInput(f"a rule has at most {MAX_ACTIONS} actions", field="actions")
    for index, action in enumerate(actions):
        _validate(conn, project_id, action, f"actions.{index}")
    return actions


def _validate(conn: Connection[Any], project_id: uuid.UUID, action: Action, where: str) -> None:
    if isinstance(action, EnrollInSequence):
        try:
            get_sequence(conn, project_id, action.sequence_id)
        except NotFound:
            raise NotFound("sequence not found", field=f"{where}.sequence_id") from None
        if action.anchor not in ("none", "event_time") and not (
            action.anchor.startswith("contact.attributes.")
            and len(action.anchor) > len("contact.attributes.")
        ):
            raise InvalidInput(
                "anchor is none, event_time or contact.attributes.<key>", field=f"{where}.anchor"
            )
        validation.json_value(action.variables, f"{where}.variables")
    elif isinstance(action, SendMessage):
        validation.message_text(action.text, f"{where}.text")
        texts = {"text": action.text}
        if action.whatsapp_template is not None:
            texts |= check_whatsapp_template(action.whatsapp_template, f"{where}.whatsapp_template")
        for name, text in texts.items():
            if not text.strip():
                raise InvalidInput(f"{name} must not be empty", field=f"{where}.{name}")
            validation.text(text, f"{where}.{name}")
            try:
                parse_template(text)
            except TemplateError as exc:
                raise InvalidInput(str(exc), field=f"{where}.{name}") from None
    elif isinstance(action, AddLabel | RemoveLabel | AddContactTag | RemoveContactTag):
        name = "labels" if isinstance(action, AddLabel | RemoveLabel) else "tags"
        items: list[str] = getattr(action, name)
        if not 1 <= len(items) <= MAX_ITEMS:
            raise InvalidInput(f"{name} has 1 to {MAX_ITEMS} items", field=f"{where}.{name}")
        for i, item in enumerate(items):
            validation.tag(item, f"{where}.{name}.{i}")
    elif isinstance(action, AssignAgent | AssignTeam):
        name = "assignee" if isinstance(action, AssignAgent) else "team"
        value: str | None = getattr(action, name)
        if value is not None and not 1 <= len(validation.text(value.strip(), f"{where}.{name}")) <= 200:
            raise InvalidInput(f"{name} must be 1 to 200 characters", field=f"{where}.{name}")
    elif isinstance(action, AddPrivateNote):
        if not 1 <= len(validation.text(action.text.strip(), f"{where}.text")) <= MAX_NOTE_LENGTH:
            raise InvalidInput(f"text must be 1 to {MAX_NOTE_LENGTH} characters", field=f"{where}.text")
    elif isinstance(action, SendWebhook):
        webhooks.validate_url(action.url, field=f"{where}.url")


# --- running ----------------------------------------------------------------------------------------------


class ActionRejected(Conflict):
    """The action was refused for a business reason (an outcome, not an error)."""

    def __init__(self, code: str, message: str | None = None) -> None:
        super().__init__(message or code.replace("_", " "))
        self.code = code


#: Refusals by the domain that are outcomes of a rule, not failures.
BUSINESS_ERRORS: tuple[type[FollowupsError], ...] = (ActionRejected, EnrollmentRejected)


@dataclass(frozen=True)
class Subject:
    """What a trigger is about, as recorded when its event happened."""

    trigger_id: int
    type: str
    project_id: uuid.UUID
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    payload: dict[str, Any]
    occurred_at: datetime


@dataclass
class Done:
    """What the actions of one rule did that matters after the commit."""

    webhook_delivery_ids: list[uuid.UUID] = field(default_factory=list)
    message_ids: list[uuid.UUID] = field(default_factory=list)
    #: Follow-ups a resolving action stopped (counted once committed).
    stopped: list[Stopped] = field(default_factory=list)


def run_actions(
    conn: Connection[Any], rule_id: uuid.UUID, actions: list[Action], subject: Subject, *, now: datetime
) -> Done:
    """Run a rule's actions in order, in the caller's transaction (the caller holds a savepoint)."""
    done = Done()
    for action in actions:
        _RUNNERS[type(action)](conn, rule_id, action, subject, now, done)
    return done


def _executed_by(rule_id: uuid.UUID) -> str:
    return f"rule:{rule_id}"


def _conversation(conn: Connection[Any], subject: Subject) -> uuid.UUID:
    """The conversation a conversation action works on: the event's, else the contact's open one."""
    if subject.conversation_id is not None:
        return subject.conversation_id
    found = conversations.open_conversation_id(conn, subject.project_id, subject.contact_id)
    if found is None:
        raise ActionRejected("no_conversation", "the contact has no open conversation to act on")
    return found


def _enroll(
    conn: Connection[Any],
    rule_id: uuid.UUID,
    action: EnrollInSequence,
    subject: Subject,
    now: datetime,
    done: Done,
) -> None:
    variables: dict[str, Any] = {"event_type": subject.type}
    for key in ("tag", "status", "stage"):
        if isinstance(subject.payload.get(key), str):
            variables[key] = subject.payload[key]
    message = subject.payload.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        variables["message_content"] = message["content"]
    variables |= action.variables
    request = EnrollRequest(
        contact_id=subject.contact_id,
        sequence_id=action.sequence_id,
        variables=variables,
        anchor_at=_anchor(conn, action.anchor, subject),
        conversation_id=subject.conversation_id,
    )
    enroll(conn, subject.project_id, request, now=now, source="rule")  # registers the release nudge


def _anchor(conn: Connection[Any], anchor: str, subject: Subject) -> datetime | None:
    if anchor == "none":
        return None
    if anchor == "event_time":
        return subject.occurred_at
    key = anchor.removeprefix("contact.attributes.")
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


def _send_message(
    conn: Connection[Any],
    rule_id: uuid.UUID,
    action: SendMessage,
    subject: Subject,
    now: datetime,
    done: Done,
) -> None:
    row = conn.execute(
        QUERIES["message_recipient"], {"project_id": subject.project_id, "contact_id": subject.contact_id}
    ).fetchone()
    if row is None:
        raise ActionRejected("contact_erased")
    name, phone, attributes, timezone, project_timezone, opted_out, consent, erased, last_inbound_at = row
    if erased:
        raise ActionRejected("contact_erased")
    if opted_out:
        raise ActionRejected("opted_out", "the contact opted out")
    settings = project_settings.get_settings(conn, subject.project_id)
    if settings.consent_mode == "required" and consent != "granted":
        raise ActionRejected("no_consent", "consent is required and the contact has not granted it")
    context = RenderContext(
        variables={"event_type": subject.type},
        anchor_at=None,
        timezone=timezone,
        fallback_timezone=project_timezone,
        contact_name=name,
        contact_phone=phone,
        contact_attributes=attributes,
    )
    outside = settings.service_window == "enforced" and outside_service_window(last_inbound_at, now)
    template = action.whatsapp_template
    if outside and template is None:
        raise ActionRejected("outside_service_window", "the contact has not written in 24 hours")
    body: str | None = None
    parameters: list[str] | None = None
    if outside and template is not None:
        parameters = [_rendered(p, context) for p in template.parameters]
    else:
        body = _rendered(action.text, context)
    # a busy conversation (ConversationBusy) is an error: the trigger is retried, and the rule with it
    queued = queue_contact_message(
        conn,
        OutboundMessage(
            project_id=subject.project_id,
            contact_id=subject.contact_id,
            body=body,
            source="rule",
            conversation_id=subject.conversation_id,
            template_name=template.name if outside and template else None,
            template_language=template.language if outside and template else None,
            template_parameters=parameters,
        ),
        now=now,
    )
    write_events(conn, subject.project_id, [queued.event], occurred_at=now)
    done.message_ids.append(queued.message_id)


def _rendered(template: str, context: RenderContext) -> str:
    rendered = render(template, context)
    if rendered.text is None:
        raise ActionRejected(
            rendered.skip_reason or "missing_value", f"the message lacks {rendered.skip_reason}"
        )
    return rendered.text


def _change(
    conn: Connection[Any],
    rule_id: uuid.UUID,
    action: AddLabel | RemoveLabel | AssignAgent | AssignTeam | ChangePriority,
    subject: Subject,
    now: datetime,
    done: Done,
) -> None:
    if isinstance(action, AddLabel):
        change = ConversationChange(add_labels=action.labels)
    elif isinstance(action, RemoveLabel):
        change = ConversationChange(remove_labels=action.labels)
    elif isinstance(action, AssignAgent):
        change = ConversationChange(assignee=action.assignee)
    elif isinstance(action, AssignTeam):
        change = ConversationChange(team=action.team)
    else:
        change = ConversationChange(priority=action.priority)
    conversations.update_conversation(conn, subject.project_id, _conversation(conn, subject), change, now=now)


def _tags(
    conn: Connection[Any],
    rule_id: uuid.UUID,
    action: AddContactTag | RemoveContactTag,
    subject: Subject,
    now: datetime,
    done: Done,
) -> None:
    if isinstance(action, AddContactTag):
        contacts.add_tags(conn, subject.project_id, subject.contact_id, action.tags)
    else:
        contacts.remove_tags(conn, subject.project_id, subject.contact_id, action.tags)


def _status(
    conn: Connection[Any],
    rule_id: uuid.UUID,
    action: ChangeStatus | SnoozeUntil,
    subject: Subject,
    now: datetime,
    done: Done,
) -> None:
    """A new status; resolving the conversation runs the conversation-resolved stop path, as when an agent
    resolves it (the contact is locked first: contact, then conversation, as everywhere)."""
    conversation_id = _conversation(conn, subject)
    if isinstance(action, SnoozeUntil):
        until = now + timedelta(minutes=action.minutes)
        conversations.change_status(
            conn, subject.project_id, conversation_id, "snoozed", now=now, snoozed_until=until
        )
        return
    if action.status == "resolved":
        contacts.lock_contact(conn, subject.project_id, subject.contact_id)
    _, previous = conversations.change_status(
        conn, subject.project_id, conversation_id, action.status, now=now
    )
    if action.status == "resolved" and previous != "resolved":
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


def _note(
    conn: Connection[Any],
    rule_id: uuid.UUID,
    action: AddPrivateNote,
    subject: Subject,
    now: datetime,
    done: Done,
) -> None:
    conversations.add_private_note(
        conn,
        subject.project_id,
        subject.contact_id,
        _conversation(conn, subject),
        action.text,
        executed_by=_executed_by(rule_id),
        now=now,
    )


def _webhook(
    conn: Connection[Any],
    rule_id: uuid.UUID,
    action: SendWebhook,
    subject: Subject,
    now: datetime,
    done: Done,
) -> None:
    payload = {
        "event": subject.type,
        "rule_id": str(rule_id),
        "trigger_id": subject.trigger_id,
        "project_id": str(subject.project_id),
        "contact_id": str(subject.contact_id),
        "conversation_id": str(subject.conversation_id) if subject.conversation_id else None,
        "occurred_at": subject.occurred_at.isoformat(),
        "data": subject.payload,
        "executed_by": _executed_by(rule_id),
    }
    delivery_id = webhooks.queue_delivery(
        conn,
        subject.project_id,
        rule_id=rule_id,
        trigger_id=subject.trigger_id,
        url=action.url,
        payload=payload,
        now=now,
    )
    done.webhook_delivery_ids.append(delivery_id)


_RUNNERS: dict[type[Any], Any] = {
    EnrollInSequence: _enroll,
    SendMessage: _send_message,
    AddLabel: _change,
    RemoveLabel: _change,
    AssignAgent: _change,
    AssignTeam: _change,
    ChangePriority: _change,
    AddContactTag: _tags,
    RemoveContactTag: _tags,
    ChangeStatus: _status,
    SnoozeUntil: _status,
    AddPrivateNote: _note,
    SendWebhook: _webhook,
}
