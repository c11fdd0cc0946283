"""A sequence's definition: its steps (a tagged union on ``kind``: ``message`` or ``ai``), their timing,
``only_if`` conditions, stop flags and re-entry policy; decoding and the checks a definition must pass to
be published; and when a step falls due.

Each step has its timing: a delay after the previous step (or after enrollment), or an offset from the
enrollment's anchor time (a reminder, for example 2 hours before ``anchor_at``) with a grace period after
which it is skipped as past due; and an optional ``only_if``.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec

from libs.common.contracts.limits import (
    MAX_KEY_LENGTH,
    MAX_MESSAGE_LENGTH,
    NOT_BLANK,
    Key,
    MediaUrl,
    MessageText,
)
from libs.common.core import decoding, validation
from libs.common.core.errors import InvalidInput, Refusals
from libs.common.followups.send_window import SendWindow, validate_window
from libs.common.followups.templates import SEGMENT_PATTERN, MissingValue, TemplateError, parse_template

#: Most steps one sequence may have.
MAX_STEPS = 50
#: Longest wait a step may declare (a year).
MAX_DELAY_SECONDS = 366 * 86400

#: Longest goal of an AI step.
MAX_GOAL_LENGTH = 1024
#: Most parameters of a WhatsApp template, and the longest one (WhatsApp's limit for a body parameter).
MAX_TEMPLATE_PARAMETERS = 100
MAX_TEMPLATE_PARAMETER_LENGTH = 1024
#: Most custom attributes an AI step may show the model, and most variables it may show or mark private.
MAX_AI_ATTRIBUTES = 50
MAX_AI_VARIABLES = 50
#: Most domains an AI step's drafts may link to.
MAX_AI_DOMAINS = 20
#: Longest domain name (DNS's limit).
MAX_DOMAIN_LENGTH = 253

NonNegative = Annotated[int, msgspec.Meta(ge=0, le=MAX_DELAY_SECONDS)]
Offset = Annotated[int, msgspec.Meta(ge=-MAX_DELAY_SECONDS, le=MAX_DELAY_SECONDS)]
#: An AI step's instructions: as long as a message may be.
Instructions = Annotated[str, msgspec.Meta(max_length=MAX_MESSAGE_LENGTH)]
TemplateParameter = Annotated[
    str,
    msgspec.Meta(
        max_length=MAX_TEMPLATE_PARAMETER_LENGTH, extra_json_schema={"minLength": 1, "pattern": NOT_BLANK}
    ),
]
#: A language code such as ``en`` or ``pt_BR`` (checked with every error at once; the schema states it).
LANGUAGE_PATTERN = r"^[a-z]{2,3}(?:_[A-Z]{2})?$"

_VARIABLE_NAME = f"^{SEGMENT_PATTERN}$"
_DOMAIN = r"^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"
#: The name of one of the enrollment's variables (a top-level key, as in ``{{vars.first_name}}``).
VariableName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KEY_LENGTH, pattern=_VARIABLE_NAME)]
#: A domain name, lowercase ASCII (an internationalised one in its ``xn--`` form): ``example.com``.
Domain = Annotated[str, msgspec.Meta(max_length=MAX_DOMAIN_LENGTH, pattern=_DOMAIN)]
decoding.PATTERNS |= {
    _VARIABLE_NAME: "must be a variable's name: letters, digits and underscores, not starting with a digit",
    _DOMAIN: "must be a domain name in lowercase, such as example.com (an internationalised one as xn--)",
}

#: What a message is for, as WhatsApp prices and limits it: ``marketing`` (a promotion, a nudge: the
#: provider's per-user marketing limit applies), ``utility`` (about something the contact did or asked for),
#: ``service`` (an answer within a conversation the contact opened).
MessageCategory = Literal["marketing", "utility", "service"]

#: ``only_if`` conditions: the step is skipped unless every one holds at release.
OnlyIf = Literal["no_reply_since_previous_step", "no_reply_since_enrollment", "previous_not_read"]
#: The conditions the first step may not have (each needs a step before it), and why.
FIRST_STEP_REFUSES: dict[str, str] = {
    "no_reply_since_previous_step": "the first step has no previous step",
    "previous_not_read": "the first step has no previous follow-up",
}


class _Def(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class TemplateFallback(_Def, kw_only=True, tag="template", tag_field="kind"):
    """Send this template instead."""

    text: MessageText


class SkipFallback(_Def, kw_only=True, tag="skip", tag_field="kind"):
    """Skip the step."""


class WhatsAppTemplate(_Def, kw_only=True):
    """An approved WhatsApp template: what a step sends outside the 24-hour service window. Each parameter
    is rendered with the same variables as the step's text."""

    #: The approved template's name: lowercase letters, digits and underscores (checked by
    #: :func:`check_whatsapp_template`, every error at once; the schema states the same).
    name: Annotated[str, msgspec.Meta(max_length=512, extra_json_schema={"pattern": "^[a-z0-9_]{1,512}$"})]
    #: A language code such as ``en`` or ``pt_BR``.
    language: Annotated[str, msgspec.Meta(max_length=16, extra_json_schema={"pattern": LANGUAGE_PATTERN})] = (
        "en"
    )
    parameters: Annotated[list[TemplateParameter], msgspec.Meta(max_length=MAX_TEMPLATE_PARAMETERS)] = (
        msgspec.field(default_factory=list)
    )


class _Step(_Def, kw_only=True):
    delay_seconds: NonNegative = 0
    anchor_offset_seconds: Offset | None = None
    grace_seconds: NonNegative = 3600
    only_if: Annotated[list[OnlyIf], msgspec.Meta(max_length=3)] = msgspec.field(default_factory=list)
    #: Only between these local hours (overrides the sequence's and the project's window).
    send_window: SendWindow | None = None
    #: Sent instead of the free-form text when the contact has not written in 24 hours.
    whatsapp_template: WhatsAppTemplate | None = None
    #: The step's category (overrides the sequence's).
    category: MessageCategory | None = None


class MessageStep(_Step, kw_only=True, tag="message", tag_field="kind"):
    """Send a text (a template), with optional media."""

    text: MessageText
    media_url: MediaUrl | None = None
    media_kind: Literal["image", "video", "audio", "document"] | None = None


class AiStep(_Step, kw_only=True, tag="ai", tag_field="kind"):
    """A message written by the model from ``instructions``; ``fallback`` when it cannot be used (the model
    unavailable or failing, its answer invalid or below ``min_confidence``, the budget used up)."""

    instructions: Instructions
    fallback: TemplateFallback | SkipFallback
    #: What the message is for (the prompt's goal); the instructions say how to write it.
    goal: Annotated[str, msgspec.Meta(max_length=MAX_GOAL_LENGTH)] | None = None
    #: Answers the model is less sure of than this (0 to 1) take the fallback.
    min_confidence: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    #: The contact's custom attributes the model may see (none by default).
    contact_attributes: Annotated[list[Key], msgspec.Meta(max_length=MAX_AI_ATTRIBUTES)] = msgspec.field(
        default_factory=list
    )
    #: The enrollment's variables the model may see (none by default; a name the enrollment lacks is left
    #: out).
    variables: Annotated[list[VariableName], msgspec.Meta(max_length=MAX_AI_VARIABLES)] = msgspec.field(
        default_factory=list
    )
    #: Variables whose values a draft must never contain (the model may see them): a draft that repeats
    #: one takes the fallback (``ai_policy``).
    private: Annotated[list[VariableName], msgspec.Meta(max_length=MAX_AI_VARIABLES)] = msgspec.field(
        default_factory=list
    )
    #: The domains a draft may link to (their subdomains too); a draft naming any other host takes the
    #: fallback (``ai_policy``). None listed: a draft may name no host at all.
    allowed_domains: Annotated[list[Domain], msgspec.Meta(max_length=MAX_AI_DOMAINS)] = msgspec.field(
        default_factory=list
    )
    #: How many of the conversation's last messages the model sees.
    history_messages: Annotated[int, msgspec.Meta(ge=0, le=50)] = 10
    #: The language the message is written in (``en``, ``pt_BR``): the prompt asks for it, and a draft
    #: plainly in another language takes the fallback (``ai_invalid_output``).
    language: (
        Annotated[str, msgspec.Meta(max_length=16, extra_json_schema={"pattern": LANGUAGE_PATTERN})] | None
    ) = None


Step = MessageStep | AiStep


class StopFlags(_Def, kw_only=True):
    """What stops an enrollment; copied onto each enrollment when it is created."""

    reply: bool = True
    human_message: bool = True
    opt_out: bool = True
    lead_closed: bool = True
    conversation_resolved: bool = True


class Definition(_Def, kw_only=True):
    #: At least one to be published (a draft may have none yet).
    steps: Annotated[list[Step], msgspec.Meta(max_length=MAX_STEPS)] = msgspec.field(default_factory=list)
    #: never: a contact enters once; after_finished: again once the previous enrollment finished;
    #: always: a new enrollment replaces the live one.
    reentry: Literal["never", "after_finished", "always"] = "after_finished"
    stop_on: StopFlags = msgspec.field(default_factory=StopFlags)
    #: The sequence's send window (overrides the project's; a step's overrides it).
    send_window: SendWindow | None = None
    #: The sequence's fixed sending number (after the enrollment's own, before the conversation's).
    number_id: uuid.UUID | None = None
    #: What its messages are for (a step's own overrides it): a follow-up is ``marketing`` unless said.
    category: MessageCategory = "marketing"

    def category_of(self, step: Step) -> MessageCategory:
        """The category of ``step``'s message: its own, else the sequence's."""
        return step.category or self.category


def decode_definition(raw: Any, field: str = "definition") -> Definition:
    """A definition from JSON-like data; a malformed one raises InvalidInput naming every refused field."""
    definition: Definition = decoding.decode(raw, Definition, field)
    return definition


def _steps_field(field: str) -> str:
    """Where a definition's steps are: ``definition.steps``, or ``steps`` for an inline (one-off) list."""
    return f"{field}.steps" if field else "steps"


def validate_definition(definition: Definition, field: str = "definition") -> Definition:
    """The checks a definition must pass to be published; every error is raised at once (one
    InvalidInput, :meth:`InvalidInput.every`), each naming its step and field.

    Field paths are dotted (``definition.steps.0.text``); ``field=""`` validates an inline list of steps
    (a one-off follow-up), named ``steps.0.text``.
    """
    steps_field = _steps_field(field)
    # the bounds of the struct's fields (lengths, counts), checked on decoding, for a definition built in code
    decode_definition(msgspec.to_builtins(definition), field)
    refusals = Refusals()
    if definition.send_window is not None:
        with refusals.check():
            validate_window(definition.send_window, f"{field}.send_window" if field else "send_window")
    if not definition.steps:
        refusals.add(steps_field, "a sequence needs at least one step")
    if len(definition.steps) > MAX_STEPS:
        refusals.add(steps_field, f"a sequence has at most {MAX_STEPS} steps")
    for index, step in enumerate(definition.steps):
        _check_step(step, index, f"{steps_field}.{index}", refusals)
    refusals.raise_any()
    return definition


def _check_step(step: Step, index: int, where: str, refusals: Refusals) -> None:
    """The checks of one step (at ``index``), each error kept in ``refusals``."""
    if step.anchor_offset_seconds is not None and step.delay_seconds:
        refusals.add(
            f"{where}.anchor_offset_seconds",
            "a step is timed either by delay_seconds or by anchor_offset_seconds, not both",
        )
    for condition in step.only_if:
        if index == 0 and condition in FIRST_STEP_REFUSES:
            refusals.add(f"{where}.only_if", FIRST_STEP_REFUSES[condition])
    if isinstance(step, MessageStep):
        with refusals.check():
            _check_media(step, where)
    elif step.language is not None and not _LANGUAGE.fullmatch(step.language):
        refusals.add(f"{where}.language", "language must be a language code such as en or pt_BR")
    if step.send_window is not None:
        with refusals.check():
            validate_window(step.send_window, f"{where}.send_window")
    for name, text in step_texts(step, where, refusals).items():
        if not text.strip():
            refusals.add(f"{where}.{name}", f"{name} must not be empty")
            continue
        try:
            parse_template(text)
        except TemplateError as exc:
            refusals.add(f"{where}.{name}", str(exc))


def step_texts(step: Step, where: str = "", refusals: Refusals | None = None) -> dict[str, str]:
    """A step's templates, keyed by field: its text (an AI step's instructions), a template fallback's
    text, its WhatsApp template's parameters (whose name and language are checked into ``refusals``)."""
    texts = {"text": step.text} if isinstance(step, MessageStep) else {"instructions": step.instructions}
    if isinstance(step, AiStep) and isinstance(step.fallback, TemplateFallback):
        texts["fallback.text"] = step.fallback.text
    if step.whatsapp_template is not None:
        texts |= check_whatsapp_template(step.whatsapp_template, f"{where}.whatsapp_template", refusals)
    return texts


_LANGUAGE = re.compile(r"[a-z]{2,3}(?:_[A-Z]{2})?")
_TEMPLATE_NAME = re.compile(r"[a-z0-9_]{1,512}")


def check_whatsapp_template(
    template: WhatsAppTemplate, where: str, refusals: Refusals | None = None
) -> dict[str, str]:
    """An approved template's name (lowercase letters, digits, underscores) and language (``en``,
    ``pt_BR``), errors kept in ``refusals`` (none given: raised); returns its parameters, keyed by field,
    to be checked as templates like the step's text."""
    own = refusals is None
    refusals = Refusals() if refusals is None else refusals
    if not _TEMPLATE_NAME.fullmatch(template.name):
        refusals.add(
            f"{where}.name",
            "name must be the approved template's name: lowercase letters, digits and underscores",
        )
    if not _LANGUAGE.fullmatch(template.language):
        refusals.add(f"{where}.language", "language must be a language code such as en or pt_BR")
    if own:
        refusals.raise_any()
    return {f"whatsapp_template.parameters.{i}": parameter for i, parameter in enumerate(template.parameters)}


class DefinitionWarning(msgspec.Struct, kw_only=True, frozen=True):
    """Something a valid definition may not do as meant: a placeholder without a fallback skips its step
    for an enrollment that lacks the value."""

    #: The text it is in (``definition.steps.1.text``).
    field: str
    #: The placeholder's path (``vars.plan``).
    placeholder: str
    #: The step run's reason when it is skipped for it (``missing_variable``, its detail the placeholder;
    #: ``missing_anchor``).
    skip_reason: MissingValue
    message: str


def placeholder_warnings(definition: Definition, field: str = "definition") -> list[DefinitionWarning]:
    """A warning for each placeholder without a fallback in a step's texts (an anchor-timed step's
    ``anchor.*`` excepted: without an anchor it is skipped anyway). The definition is a valid one."""
    out: list[DefinitionWarning] = []
    for index, step in enumerate(definition.steps):
        where = f"{_steps_field(field)}.{index}"
        for name, text in step_texts(step, where).items():
            try:
                unguarded = parse_template(text).unguarded()
            except TemplateError:  # a draft's malformed text: publishing refuses it, naming it
                continue
            for path, reason in unguarded.items():
                if reason == "missing_anchor" and step.anchor_offset_seconds is not None:
                    continue
                out.append(
                    DefinitionWarning(
                        field=f"{where}.{name}",
                        placeholder=path,
                        skip_reason=reason,
                        message=f"{{{{{path}}}}} has no fallback: the step is skipped ({reason}) for an"
                        f' enrollment without it; write {{{{{path} | "..."}}}} to send a default instead',
                    )
                )
    return out


def _check_media(step: MessageStep, where: str) -> None:
    """Media is an http(s) URL with its kind; a kind without a URL is a mistake, not a text message."""
    if step.media_url is None:
        if step.media_kind is not None:
            raise InvalidInput("media_kind needs a media_url", field=f"{where}.media_url")
        return
    try:
        url = urlsplit(step.media_url)
    except ValueError:  # an unbalanced IPv6 bracket, say
        url = urlsplit("")
    if url.scheme not in ("http", "https") or not url.netloc or any(c.isspace() for c in step.media_url):
        raise InvalidInput("media_url must be an http or https URL", field=f"{where}.media_url")
    if step.media_kind is None:
        raise InvalidInput(
            "media_kind (image, video, audio or document) is needed with a media_url",
            field=f"{where}.media_kind",
        )


def storable(definition: Definition, field: str) -> Definition:
    """A definition PostgreSQL can store (no NUL character in any text), else InvalidInput naming it."""
    validation.json_value(msgspec.to_builtins(definition.steps), _steps_field(field))
    return definition


def step_due_at(step: Step, *, now: datetime, anchor_at: datetime | None) -> datetime | None:
    """When ``step`` is due if the previous step (or the enrollment) happened at ``now``.

    None for an anchor-timed step of an enrollment without an anchor: it is due now and will be skipped.
    """
    if step.anchor_offset_seconds is None:
        return now + timedelta(seconds=step.delay_seconds)
    if anchor_at is None:
        return None
    return anchor_at + timedelta(seconds=step.anchor_offset_seconds)


def check_anchor(definition: Definition, anchor_at: datetime | None, field: str = "anchor_at") -> None:
    """An anchor every anchor-timed step of the definition can be scheduled from (a time so near year 1 or
    9999 that a step's offset leaves the calendar is refused, naming ``field``)."""
    if anchor_at is None:
        return
    for step in definition.steps:
        if step.anchor_offset_seconds is not None:
            try:
                (anchor_at + timedelta(seconds=step.anchor_offset_seconds)).astimezone(UTC)
            except OverflowError:
                raise InvalidInput(
                    "anchor_at is too near the ends of the calendar for the steps' offsets", field=field
                ) from None
