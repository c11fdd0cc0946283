"""The rule page's "Test against a contact" form: a contact typed as its phone or id, a conversation
(optional: the contact's open one for a conversation or message rule), the event's data (optional JSON),
read into the dry run's request (:mod:`libs.common.rules.dry_run`); and its answer as the page shows it: the
tree with each condition's result and the value it compared (attributes by their labels), the actions that
would run, and a delayed rule's episode and due time."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
from psycopg import Connection

from libs.common.contracts.labels import label
from libs.common.rules.dry_run import DryRunRequest
from libs.common.rules.trace import ConditionResult, GroupResult
from services.api.dashboard.forms import Form, FormErrors
from services.api.dashboard.queries import typed_contact_id

#: The form's field for each field of the request (an error of the domain is shown next to its input).
FIELDS = {"contact_id": "contact", "conversation_id": "conversation", "event": "event"}
#: What the event's data looks like, for the hint.
EVENT_EXAMPLE = '{"message": {"type": "incoming", "content": "what is the price?"}}'


@dataclass
class DryRunForm:
    """What was typed into the form."""

    contact: str = ""
    conversation: str = ""
    event: str = ""

    @classmethod
    def of_form(cls, form: Form) -> DryRunForm:
        return cls(form.get("contact"), form.get("conversation"), form.get("event"))

    def request(
        self, conn: Connection[Any], project_id: uuid.UUID, errors: FormErrors
    ) -> DryRunRequest | None:
        """The dry run's request (None, with the errors on their fields, when the form does not make one);
        msgspec.ValidationError for data the request refuses."""
        contact_id = typed_contact_id(conn, project_id, self.contact, errors, field="contact")
        conversation_id = None
        if self.conversation.strip():
            try:
                conversation_id = uuid.UUID(self.conversation.strip())
            except ValueError:
                errors.add("conversation", "enter the conversation's id (or leave it empty)")
        event = None
        if self.event.strip():
            try:
                event = json.loads(self.event)
            except ValueError as exc:
                errors.add("event", f"not JSON ({exc}): write an object such as {EVENT_EXAMPLE}")
        if errors:
            return None
        body = {"contact_id": str(contact_id), "conversation_id": conversation_id, "event": event}
        return msgspec.convert(body, DryRunRequest)


@dataclass(frozen=True)
class ShownNode:
    """A node of the evaluated tree as the page shows it."""

    path: str
    #: ``All of these`` / ``Any of these``, or the condition in words (its attribute by its label).
    text: str
    result: bool
    #: A condition's compared value, as JSON ("absent" when the context has none); None for a group.
    actual: str | None = None
    children: list[ShownNode] = field(default_factory=list)


def shown(node: ConditionResult) -> ShownNode:
    if isinstance(node, GroupResult):
        text = "All of these" if node.kind == "all" else "Any of these"
        if not node.children:
            text = "Always" if node.kind == "all" else "Never"
        return ShownNode(node.path, text, node.result, children=[shown(child) for child in node.children])
    words = f"{label(node.attribute, 'attribute')} {node.operator.replace('_', ' ')}"
    if node.value is not None:
        words += f" {json.dumps(node.value, ensure_ascii=False)}"
    actual = "absent" if node.actual is None else json.dumps(node.actual, ensure_ascii=False)
    return ShownNode(node.path, words, node.result, actual=actual)
