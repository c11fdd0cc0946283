"""The sequence builder's step form: a message, an AI-written message, or a reminder (a message timed from
the enrollment's anchor); its wait, only-if conditions, send window override and WhatsApp template; and its
preview for a chosen contact.

A "wait" is not a step of its own in the definition: each step waits ``delay_seconds`` after the previous
one (or after enrollment). Inputs carry the API's step field names (``text``, ``fallback.text``,
``send_window.start``, ...); the wait, the anchor offset and the grace period are typed as a number and a
unit, and their errors (``delay_seconds``, ``anchor_offset_seconds``, ``grace_seconds``) are shown beside
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from libs.common.core.reasons import stored
from libs.common.followups.definition import (
    FIRST_STEP_REFUSES,
    AiStep,
    BranchStep,
    MessageStep,
    Node,
    SplitStep,
    Step,
    TemplateFallback,
    WaitForReplyStep,
)
from libs.common.followups.send_window import WEEKDAYS
from libs.common.followups.templates import RenderContext, TemplateError, render_message
from services.api.dashboard.forms import (
    SECOND_UNITS,
    Form,
    FormErrors,
    join_delay,
    lines,
    split_delay,
    whole_number,
)

#: The step types the form offers: a reminder is a message timed from the enrollment's anchor.
KINDS = [
    ("message", "Message"),
    ("ai", "AI-written message"),
    ("reminder", "Reminder (timed from the anchor)"),
]
TIMINGS = [("wait", "After a wait"), ("anchor", "Relative to the anchor (a reminder)")]
ONLY_IF = [
    ("no_reply_since_previous_step", "the contact has not replied since the previous step"),
    ("no_reply_since_enrollment", "the contact has not replied since enrolling"),
    ("previous_not_read", "the previous follow-up has not been read"),
]


def only_if_choices(index: int) -> list[tuple[str, str]]:
    """The ``only_if`` conditions a step at ``index`` may have (the first has no previous step)."""
    return [(value, label) for value, label in ONLY_IF if not (index == 0 and value in FIRST_STEP_REFUSES)]


MEDIA_KINDS = [
    ("", "none"),
    ("image", "image"),
    ("video", "video"),
    ("audio", "audio"),
    ("document", "document"),
]
UNIT_CHOICES = [(unit, unit) for unit in SECOND_UNITS]
#: An AI step's lists of names, each a textarea of one name a line, and its label.
AI_LISTS = {
    "variables": "Variables the model sees (one name a line; none: no variable)",
    "private": "Private variables: the model may see them, the message may not repeat them (one a line)",
    "contact_attributes": "Contact attributes the model sees (one key a line)",
    "allowed_domains": "Domains the message may link to, with their subdomains (one a line; none: no link)",
}
#: The template variables a step's text may use (shown beside the text).
VARIABLES = (
    "{{contact.name}}",
    "{{contact.phone}}",
    "{{contact.attributes.<key>}}",
    "{{vars.<name>}}",
    "{{anchor.date}}",
    "{{anchor.time}}",
    "{{anchor.datetime}}",
    "{{anchor.weekday}}",
    '{{contact.name | "there"}}',
)


@dataclass
class StepForm:
    kind: str = "message"
    #: The step's id ("": none) and where it goes after ("": the next step in the list).
    id: str = ""
    next: str = ""
    text: str = ""
    media_url: str = ""
    media_kind: str = ""
    instructions: str = ""
    goal: str = ""
    fallback_kind: str = "template"
    fallback_text: str = ""
    min_confidence: str = "0.5"
    history_messages: str = "10"
    language: str = ""
    timing: str = "wait"
    wait_value: str = ""
    wait_unit: str = "hours"
    offset_value: str = "2"
    offset_unit: str = "hours"
    offset_direction: str = "before"
    grace_value: str = "1"
    grace_unit: str = "hours"
    only_if: list[str] = field(default_factory=list)
    window: bool = False
    window_start: str = "09:00"
    window_end: str = "18:00"
    window_days: list[str] = field(default_factory=lambda: list(WEEKDAYS[:5]))
    template_name: str = ""
    template_language: str = "en"
    template_parameters: str = ""
    #: The step's category ("": its sequence's).
    category: str = ""
    #: An AI step's lists (one name a line): what the model sees, what it must not repeat, where it may link.
    ai_lists: dict[str, str] = field(default_factory=lambda: dict.fromkeys(AI_LISTS, ""))

    @classmethod
    def preset(cls, kind: str, index: int) -> StepForm:
        """A new step at ``index``: ``message``, ``ai`` or ``reminder`` (a message timed from the anchor);
        the first step goes out at once, a later one a day after the previous."""
        if kind == "reminder":
            return cls(kind="reminder", timing="anchor")
        wait = ("1", "days") if index else ("0", "hours")
        return cls(kind="ai" if kind == "ai" else "message", wait_value=wait[0], wait_unit=wait[1])

    @classmethod
    def of_step(cls, step: Step) -> StepForm:
        out = cls(id=step.id or "", next=step.next or "")
        if isinstance(step, MessageStep):
            out.kind, out.text = "message", step.text
            out.media_url, out.media_kind = step.media_url or "", step.media_kind or ""
        else:
            out.kind, out.instructions, out.goal = "ai", step.instructions, step.goal or ""
            out.min_confidence = str(step.min_confidence)
            out.history_messages = str(step.history_messages)
            out.ai_lists = {name: "\n".join(getattr(step, name)) for name in AI_LISTS}
            out.language = step.language or ""
            if isinstance(step.fallback, TemplateFallback):
                out.fallback_kind, out.fallback_text = "template", step.fallback.text
            else:
                out.fallback_kind = "skip"
        if step.anchor_offset_seconds is not None:
            out.timing = "anchor"
            out.kind = "reminder" if out.kind == "message" else out.kind
            out.offset_direction = "before" if step.anchor_offset_seconds < 0 else "after"
            out.offset_value, out.offset_unit = split_delay(abs(step.anchor_offset_seconds), SECOND_UNITS)
            out.offset_value = out.offset_value or "0"
            out.grace_value, out.grace_unit = split_delay(step.grace_seconds, SECOND_UNITS)
            out.grace_value = out.grace_value or "0"
        else:
            out.wait_value, out.wait_unit = split_delay(step.delay_seconds, SECOND_UNITS)
            out.wait_value = out.wait_value or "0"
        out.only_if = list(step.only_if)
        if step.send_window is not None:
            out.window = True
            out.window_start, out.window_end = step.send_window.start, step.send_window.end
            out.window_days = list(step.send_window.days)
        if step.whatsapp_template is not None:
            out.template_name = step.whatsapp_template.name
            out.template_language = step.whatsapp_template.language
            out.template_parameters = "\n".join(step.whatsapp_template.parameters)
        out.category = step.category or ""
        return out

    @classmethod
    def of_form(cls, form: Form) -> StepForm:
        kind = form.get("kind") or "message"
        return cls(
            kind=kind,
            id=form.get("id"),
            next=form.get("next"),
            text=form.get("text"),
            media_url=form.get("media_url"),
            media_kind=form.get("media_kind"),
            instructions=form.get("instructions"),
            goal=form.get("goal"),
            fallback_kind=form.get("fallback.kind") or "template",
            fallback_text=form.get("fallback.text"),
            min_confidence=form.get("min_confidence"),
            history_messages=form.get("history_messages"),
            language=form.get("language"),
            timing="anchor" if kind == "reminder" else form.get("timing") or "wait",
            wait_value=form.get("wait_value"),
            wait_unit=form.get("wait_unit") or "hours",
            offset_value=form.get("offset_value"),
            offset_unit=form.get("offset_unit") or "hours",
            offset_direction=form.get("offset_direction") or "before",
            grace_value=form.get("grace_value"),
            grace_unit=form.get("grace_unit") or "hours",
            only_if=form.getall("only_if"),
            window=form.checked("window"),
            window_start=form.get("send_window.start"),
            window_end=form.get("send_window.end"),
            window_days=form.getall("send_window.days"),
            template_name=form.get("whatsapp_template.name"),
            template_language=form.get("whatsapp_template.language"),
            template_parameters=form.get("whatsapp_template.parameters"),
            category=form.get("category"),
            ai_lists={name: form.get(name) for name in AI_LISTS},
        )

    def payload(self, errors: FormErrors) -> dict[str, Any]:
        """The step as the API's JSON (a definition's ``steps`` item)."""
        out: dict[str, Any] = {"kind": "ai" if self.kind == "ai" else "message"}
        out["id"] = self.id.strip() or None
        out["next"] = self.next or None
        if self.kind == "ai":
            out["instructions"] = self.instructions
            out["goal"] = self.goal.strip() or None
            out["fallback"] = (
                {"kind": "template", "text": self.fallback_text}
                if self.fallback_kind == "template"
                else {"kind": "skip"}
            )
            out |= {name: lines(self.ai_lists.get(name, "")) for name in AI_LISTS}
            history = whole_number(self.history_messages, "history_messages", errors)
            out["history_messages"] = 10 if history is None else history
            confidence = self.min_confidence.strip() or "0.5"
            try:
                out["min_confidence"] = float(confidence)
            except ValueError:
                errors.add("min_confidence", f"{confidence!r} is not a number between 0 and 1")
            out["language"] = self.language.strip() or None
        else:
            out["text"] = self.text
            out["media_url"] = self.media_url.strip() or None
            out["media_kind"] = self.media_kind or None
        if self.timing == "anchor":
            offset = join_delay(
                self.offset_value,
                self.offset_unit,
                SECOND_UNITS,
                "anchor_offset_seconds",
                errors,
                required=True,
            )
            grace = join_delay(
                self.grace_value, self.grace_unit, SECOND_UNITS, "grace_seconds", errors, required=False
            )
            if offset is not None:
                out["anchor_offset_seconds"] = -offset if self.offset_direction == "before" else offset
            out["grace_seconds"] = 3600 if grace is None else grace
        else:
            wait = join_delay(
                self.wait_value, self.wait_unit, SECOND_UNITS, "delay_seconds", errors, required=False
            )
            out["delay_seconds"] = wait or 0
        out["only_if"] = self.only_if
        if self.window:
            out["send_window"] = {
                "start": self.window_start,
                "end": self.window_end,
                "days": self.window_days,
            }
        if self.template_name.strip():
            out["whatsapp_template"] = {
                "name": self.template_name.strip(),
                "language": self.template_language.strip() or "en",
                "parameters": lines(self.template_parameters),
            }
        out["category"] = self.category or None
        return out


def describe(step: Node) -> dict[str, Any]:
    """A step as the builder lists it."""
    timing: tuple[str, int, int | None]
    if not isinstance(step, MessageStep | AiStep):
        delay = step.timeout_seconds if isinstance(step, WaitForReplyStep) else step.delay_seconds
        kind = (
            "branch" if isinstance(step, BranchStep) else "split" if isinstance(step, SplitStep) else "wait"
        )
        return {
            "kind": kind,
            "id": step.id,
            "next": None,
            "text": "",
            "fallback": None,
            "timing": ("wait", delay, None),
            "only_if": [],
            "window": None,
            "template": None,
        }
    if step.anchor_offset_seconds is not None:
        offset = step.anchor_offset_seconds
        timing = ("before" if offset < 0 else "after", abs(offset), step.grace_seconds)
    else:
        timing = ("wait", step.delay_seconds, None)
    return {
        "kind": "ai" if isinstance(step, AiStep) else ("reminder" if timing[0] != "wait" else "message"),
        "id": step.id,
        "next": step.next,
        "text": step.text if isinstance(step, MessageStep) else step.instructions,
        "fallback": (
            step.fallback.text
            if isinstance(step, AiStep) and isinstance(step.fallback, TemplateFallback)
            else ("skip" if isinstance(step, AiStep) else None)
        ),
        "timing": timing,
        "only_if": [label for value, label in ONLY_IF if value in step.only_if],
        "window": step.send_window,
        "template": step.whatsapp_template.name if step.whatsapp_template else None,
    }


@dataclass(frozen=True)
class Preview:
    """What a step would send to one contact, or why it would be skipped."""

    text: str | None
    skipped: str | None
    note: str | None = None


def preview(
    step: Step,
    *,
    contact: Any,
    variables: dict[str, Any],
    anchor_at: datetime | None,
    project_timezone: str,
) -> Preview:
    """Render ``step`` for ``contact`` (a :class:`libs.common.platform.contacts.Contact`) as the release
    would: a missing variable without a fallback, or a text its values make too long, means the step would
    be skipped."""
    context = RenderContext(
        variables=variables,
        anchor_at=anchor_at,
        timezone=contact.timezone,
        fallback_timezone=project_timezone,
        contact_name=contact.name,
        contact_phone=contact.phone,
        contact_attributes=contact.attributes,
    )
    if isinstance(step, AiStep):
        if not isinstance(step.fallback, TemplateFallback):
            return Preview(None, None, "Written by the model at release; no fallback (skipped if unusable).")
        source, note = step.fallback.text, "Written by the model at release; this is its fallback:"
    else:
        source, note = step.text, None
    try:
        rendered = render_message(source, context)
    except TemplateError as exc:
        return Preview(None, None, f"The text is not a valid template: {exc}")
    skipped = stored(rendered.skip_reason, rendered.skip_detail) if rendered.skip_reason else None
    return Preview(rendered.text, skipped, note)
