"""What every rule action shares: the base struct (its fields, its ``validate`` and its ``run``), what a
trigger is about (:class:`Subject`), what the actions did (:class:`Done`), a business refusal
(:class:`ActionRejected`), and the form metadata the dashboard derives an action's inputs from
(:func:`form`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from psycopg import Connection

from libs.common.contracts.limits import MAX_ACTION_LABELS, NOT_BLANK
from libs.common.core import validation
from libs.common.core.errors import Conflict, FollowupsError, InvalidInput
from libs.common.core.reasons import FrequencyCap
from libs.common.followups.enrollments import EnrollmentRejected, EnrollmentRejection
from libs.common.followups.stops import Stopped
from libs.common.followups.templates import TemplateSkip
from libs.common.platform import conversations

#: Most labels or tags one action changes.
MAX_ITEMS = MAX_ACTION_LABELS
#: The bounds of an action's tags or labels, as the schema states them (``check_items`` checks them).
ITEMS_BOUNDS = msgspec.Meta(extra_json_schema={"minItems": 1, "maxItems": MAX_ITEMS})
#: Longest assignee or team of a conversation.
MAX_ASSIGNEE_LENGTH = 200
#: An agent or a team: not blank, at most :data:`MAX_ASSIGNEE_LENGTH` characters (the schema says it).
Assignee = Annotated[
    str,
    msgspec.Meta(max_length=MAX_ASSIGNEE_LENGTH, extra_json_schema={"minLength": 1, "pattern": NOT_BLANK}),
]


def form(label: str, *, widget: str | None = None, parts: dict[str, Any] | None = None) -> msgspec.Meta:
    """An action field's input on the dashboard's rule form: its ``label``, and a ``widget`` where the type
    alone does not say it (``textarea``, ``select:<choices>``); ``parts`` labels the inputs of a nested
    struct, each ``label`` or ``(label, widget)``. Carried as the field's ``Meta.extra`` (not in the API's
    schema)."""
    extra: dict[str, Any] = {"label": label}
    if widget is not None:
        extra["widget"] = widget
    if parts is not None:
        extra["parts"] = parts
    return msgspec.Meta(extra={"form": extra})


#: Why an action refuses to act (:class:`ActionRejected`'s codes): no conversation to act on, the contact
#: erased, opted out, without consent, outside the service window without an approved template, a marketing
#: message past the contact's frequency cap (``contact_cap``, ``contact_day_cap``), or a text
#: that cannot be rendered (``missing_variable`` with the placeholder as detail, ``missing_anchor``,
#: ``message_too_long``).
ActionRefusal = Literal[
    "no_conversation",
    "contact_erased",
    "opted_out",
    "no_consent",
    "outside_service_window",
    TemplateSkip,
    FrequencyCap,
]
#: Why a rule's run was refused, as its run and a delayed execution record it (with the detail of
#: ``missing_variable``): an action's refusal, or ``enroll()``'s.
RuleRefusal = Literal[ActionRefusal, EnrollmentRejection]


class ActionRejected(Conflict):
    """The action was refused for a business reason (an outcome, not an error)."""

    code: ActionRefusal

    def __init__(self, code: ActionRefusal, message: str | None = None, *, detail: str | None = None) -> None:
        super().__init__(message or code.replace("_", " "))
        self.code = code
        #: What the refusal is about (the placeholder of ``missing_variable``).
        self.detail = detail


#: Refusals by the domain that are outcomes of a rule, not failures.
BUSINESS_ERRORS: tuple[type[FollowupsError], ...] = (ActionRejected, EnrollmentRejected)


def refusal_of(refusal: Exception) -> tuple[RuleRefusal, str | None]:
    """The code and the detail of one of :data:`BUSINESS_ERRORS`."""
    if isinstance(refusal, ActionRejected):
        return refusal.code, refusal.detail
    assert isinstance(refusal, EnrollmentRejected), refusal
    return refusal.code, None


@dataclass(frozen=True)
class Subject:
    """What a trigger is about, as recorded when its event happened."""

    #: The internal key (rule runs, episodes); never shown to the project.
    trigger_id: int
    #: The id the project sees (a webhook's body, a delivery): random, it tells nothing of other projects.
    trigger_public_id: uuid.UUID
    type: str
    project_id: uuid.UUID
    contact_id: uuid.UUID
    conversation_id: uuid.UUID | None
    payload: dict[str, Any]
    occurred_at: datetime
    #: The delayed execution running the rule (None when the rule runs on its trigger at once).
    execution_id: uuid.UUID | None = None


@dataclass
class Done:
    """What the actions of one rule did that matters after the commit."""

    webhook_delivery_ids: list[uuid.UUID] = field(default_factory=list)
    message_ids: list[uuid.UUID] = field(default_factory=list)
    #: Follow-ups a resolving action stopped (counted once committed).
    stopped: list[Stopped] = field(default_factory=list)


#: What an action reads of its writes once they are sent: called after the rule's statements went out, it
#: raises what the action would have raised had it read them at once.
Check = Callable[[], object]


class BaseAction(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    """One action of a rule: a subclass is one kind (its ``tag``), its fields, what it checks when the rule
    is saved and what it does when the rule runs."""

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        """Check the action against the project and its own rules; errors name ``<where>.<field>``."""

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> Check | None:
        """Do it, in the caller's transaction; a business refusal raises :class:`ActionRejected`. What it
        only has to check of a write (that its row was there) it may leave to the :data:`Check` it returns,
        so that the write goes out with the statements after it (``send_actions``)."""
        raise NotImplementedError


def executed_by(rule_id: uuid.UUID) -> str:
    """Who made a change an action made: ``rule:<id>``."""
    return f"rule:{rule_id}"


def conversation_of(conn: Connection[Any], subject: Subject) -> uuid.UUID:
    """The conversation a conversation action works on: the event's, else the contact's open one."""
    if subject.conversation_id is not None:
        return subject.conversation_id
    found = conversations.open_conversation_id(conn, subject.project_id, subject.contact_id)
    if found is None:
        raise ActionRejected("no_conversation", "the contact has no open conversation to act on")
    return found


def check_items(items: list[str], name: str, where: str) -> None:
    """Labels or tags: 1 to :data:`MAX_ITEMS`, each a valid tag."""
    if not 1 <= len(items) <= MAX_ITEMS:
        raise InvalidInput(f"{name} has 1 to {MAX_ITEMS} items", field=f"{where}.{name}")
    for i, item in enumerate(items):
        validation.tag(item, f"{where}.{name}.{i}")


def check_assignee(value: str | None, name: str, where: str) -> None:
    """An agent or a team: none, or 1 to :data:`MAX_ASSIGNEE_LENGTH` characters."""
    if (
        value is not None
        and not 1 <= len(validation.text(value.strip(), f"{where}.{name}")) <= MAX_ASSIGNEE_LENGTH
    ):
        raise InvalidInput(f"{name} must be 1 to {MAX_ASSIGNEE_LENGTH} characters", field=f"{where}.{name}")
