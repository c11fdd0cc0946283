"""A sequence's time-travel preview page: a contact (picked from the project's, or typed as its phone or id),
an anchor, variables, when it would be enrolled and whether the contact replies at each wait for a reply,
read into the preview's request (:mod:`libs.common.followups.preview`); its answer drawn as a timeline of
the steps in the order the contact would take them: each step's time on the contact's wall clock, its
deferrals and their reasons, the text it would send or why it would be skipped, the path a branch, a wait or
a split would take; then the steps it would not reach."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath
from psycopg import Connection

from libs.common.contracts.labels import label
from libs.common.followups import preview, sequences
from libs.common.followups.preview import MAX_DEFERRALS, Preview, PreviewRequest, PreviewStep
from libs.common.platform import contacts
from services.api.dashboard.base import project_of
from services.api.dashboard.forms import Form, FormErrors, anchor_time, key_values, try_form
from services.api.dashboard.queries import typed_contact_id
from services.api.dashboard.render import moment, page
from services.api.deps import runtime_of, transaction

#: The form's input for each field of the request (an error of the domain is shown next to its input).
FIELDS = {"contact_id": "contact", "phone": "contact"}
#: The contacts the picker offers (the project's first, in id order; any other is typed as its phone or id).
PICKER_CONTACTS = 200
#: A step's kind as the timeline heads it.
KINDS = {
    "message": "Message",
    "ai": "AI-written message",
    "branch": "Branch",
    "wait_for_reply": "Wait for a reply",
    "split": "Split",
}
#: How a step's outcome is drawn: the timeline's state (its dot) and its words.
OUTCOMES = {
    "queued": ("done", "sent"),
    "skipped": ("skipped", "skipped"),
    "branched": ("done", "takes a path"),
    "paused": ("stopped", "the enrollment pauses"),
    "stopped": ("stopped", "the enrollment stops"),
    "deferred": ("waiting", "still held back: the preview stops here"),
    "not_reached": ("later", "not reached"),
}


@dataclass
class PreviewForm:
    """What was typed into the form."""

    contact: str = ""
    anchor_at: str = ""
    enrolled_at: str = ""
    variables: str = ""
    assume_reply: bool = False

    @classmethod
    def of_form(cls, form: Form) -> PreviewForm:
        return cls(
            contact=form.get("contact"),
            anchor_at=form.get("anchor_at"),
            enrolled_at=form.get("enrolled_at"),
            variables=form.get("variables"),
            assume_reply=form.checked("assume_reply"),
        )

    def request(
        self, conn: Connection[Any], project_id: uuid.UUID, errors: FormErrors
    ) -> PreviewRequest | None:
        """The preview's request (None, with the errors on their fields, when the form does not make one);
        msgspec.ValidationError for data the request refuses."""
        contact_id = typed_contact_id(conn, project_id, self.contact, errors, field="contact")
        anchor = anchor_time(self.anchor_at, errors, "anchor_at")
        enrolled = anchor_time(self.enrolled_at, errors, "enrolled_at", what="the enrollment time")
        variables = key_values(self.variables, "variables", errors)
        if errors:
            return None
        body = {
            "contact_id": str(contact_id),
            "anchor_at": anchor.isoformat() if anchor else None,
            "enrolled_at": enrolled.isoformat() if enrolled else None,
            "variables": variables,
            "assume_reply": self.assume_reply,
        }
        return msgspec.convert(body, PreviewRequest)


@dataclass(frozen=True)
class ShownStep:
    """A step of the timeline as the page draws it."""

    state: str
    title: str
    outcome: str
    at: datetime | None
    local_at: str | None
    reason: str | None
    text: str | None
    deferrals: list[str] = field(default_factory=list)


def shown(step: PreviewStep) -> ShownStep:
    state, outcome = OUTCOMES[step.outcome]
    text = step.text
    if step.written_by_model:
        text = "Written by the model when the step goes (it is not called for a preview)."
    elif step.template is not None:
        text = f"WhatsApp template {step.template.name} ({step.template.language}): " + ", ".join(
            step.template.parameters
        )
    held = [
        f"{label(d.reason, 'reason', d.reason_detail)}: held until {moment(d.until)}" for d in step.deferrals
    ]
    return ShownStep(
        state=state,
        title=f"Step {step.step_index + 1} · {KINDS[step.kind]}",
        outcome=outcome,
        at=step.at,
        local_at=_local(step.local_at),
        reason=label(step.reason, "reason", step.reason_detail) if step.reason else None,
        text=text,
        deferrals=held,
    )


def _local(local_at: str | None) -> str | None:
    """A time on the contact's wall clock as the timeline shows it: ``Tue 2030-01-01 09:00 local``."""
    if local_at is None:
        return None
    return datetime.fromisoformat(local_at).strftime("%a %Y-%m-%d %H:%M local")


class SequencePreviewController(Controller):
    """A sequence's preview for a contact."""

    path = "/sequences"

    @get("/{sequence_id:uuid}/preview", sync_to_thread=True)
    def form(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._page(
            request, sequence_id, PreviewForm(contact=request.query_params.get("contact") or "")
        )

    @post("/{sequence_id:uuid}/preview", sync_to_thread=True)
    def run(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        """Preview the sequence for the contact: the page with its timeline."""
        project_id = project_of(request)
        runtime = runtime_of(request)
        settings = runtime.settings
        typed = PreviewForm.of_form(Form.of(request))

        def attempt(conn: Connection[Any], errors: FormErrors) -> Preview | None:
            data = typed.request(conn, project_id, errors)
            if data is None:
                return None
            now = runtime.clock.now()
            lease = settings.ai.step_lease
            return preview.preview(
                conn, project_id, sequence_id, data, settings.followup, now=now, ai_lease=lease
            )

        tried = try_form(runtime, attempt, FIELDS, owner="sequence_id")  # another project's: the 404 page
        return self._page(
            request, sequence_id, typed, answer=tried.answer, errors=tried.errors, status=tried.status
        )

    def _page(
        self,
        request: Request[Any, Any, Any],
        sequence_id: uuid.UUID,
        typed: PreviewForm,
        *,
        answer: Preview | None = None,
        errors: FormErrors | None = None,
        status: int = 200,
    ) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_id, sequence_id)
            picked = contacts.list_contacts(conn, project_id, limit=PICKER_CONTACTS)
        return page(
            request,
            "sequences/preview.html",
            status=status,
            title=f"Preview of {sequence.name}",
            sequence=sequence,
            typed=typed,
            errors=errors or FormErrors(),
            picker=[(c.phone, c.name or "") for c in picked],
            answer=answer,
            steps=[shown(step) for step in answer.steps] if answer else [],
            max_deferrals=MAX_DEFERRALS + 1,
        )
