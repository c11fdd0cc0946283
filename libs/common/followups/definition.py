"""A sequence's definition: its steps (a tagged union on ``kind``: ``message`` and ``ai`` send; ``branch``,
``wait_for_reply`` and ``split`` route), their timing, ``only_if`` conditions, stop flags, re-entry policy,
goals and exits; decoding and the checks a definition must pass to be published; and when a step falls due.

Each sending step has its timing: a delay after the previous step (or after enrollment), or an offset from
the enrollment's anchor time (a reminder, for example 2 hours before ``anchor_at``) with a grace period
after which it is skipped as past due; and an optional ``only_if``.

The steps are a graph kept as a list: an enrollment goes from a step to the next one in the list unless the
step names where it goes (a sending step's ``next``, a branch's paths, a wait's reply and timeout paths, a
split's variants), by a later step's ``id`` or ``end``. Every target lies after its step, so a path never
loops and each step runs at most once per enrollment (its step run's key). Paths end (``end``) or rejoin
(two paths naming the same later step). :mod:`~libs.common.followups.graph` walks it.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal
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
from libs.common.platform.conditions import Event, check_event_fields, parse_conditions, parse_segment

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


#: Where a step's path goes: ``end``, or this id (a later step's).
END: Final = "end"
_ID = r"^[a-z0-9][a-z0-9_-]{0,63}$"
decoding.PATTERNS |= {_ID: "must be lowercase letters, digits, _ and -, starting with a letter or digit"}
#: A step's id, a path's, variant's, experiment's, goal's or exit's name: ``follow_up-2``.
Name = Annotated[str, msgspec.Meta(max_length=64, pattern=_ID)]
#: Most paths of a branch, variants of a split, goals and exits of a sequence.
MAX_PATHS = 10
MAX_VARIANTS = 10
MAX_GOALS = 10
#: Longest conversion window: 90 days.
MAX_CONVERSION_WINDOW_SECONDS = 90 * 86400
#: A variant's weight: its share of a split is its weight over the sum (the holdout's included).
Weight = Annotated[int, msgspec.Meta(ge=1, le=10_000)]


class _Node(_Def, kw_only=True):
    #: What a branch, a wait, a split or another step's ``next`` names this step by (``end`` is taken).
    id: Name | None = None


class _Step(_Node, kw_only=True):
    #: Where the enrollment goes after this step: a later step's id, or ``end``; none: the next step.
    next: Name | None = None
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


class BranchPath(_Def, kw_only=True):
    """One path of a branch: taken when its conditions hold (the first path that holds wins)."""

    name: Name
    #: Conditions on the contact, in the rules' syntax without event attributes: its attributes and tags,
    #: its newest conversation, lead status and deal stage (none: always).
    when: dict[str, Any] | None = None
    #: Whether the previous follow-up message was read (true) or not (false); none: either.
    read: bool | None = None
    #: Where the path starts: a later step's id, or ``end``.
    to: Name


class BranchStep(_Node, kw_only=True, tag="branch", tag_field="kind"):
    """Send nothing: route the enrollment down the first path whose conditions hold, else ``otherwise``."""

    #: How long after the previous step the branch is taken (its conditions read then).
    delay_seconds: NonNegative = 0
    paths: Annotated[list[BranchPath], msgspec.Meta(min_length=1, max_length=MAX_PATHS)]
    #: Where an enrollment no path holds for goes: a later step's id, or ``end``; none: the next step.
    otherwise: Name | None = None


class WaitForReplyStep(_Node, kw_only=True, tag="wait_for_reply", tag_field="kind"):
    """Send nothing: wait up to ``timeout_seconds`` for the contact's reply. A reply takes ``on_reply`` at
    once (none: the reply stops the enrollment, as a reply always does); no reply by then, ``on_timeout``."""

    timeout_seconds: Annotated[int, msgspec.Meta(ge=1, le=MAX_DELAY_SECONDS)]
    #: The reply path: a later step's id, or ``end`` (the enrollment completes); none: the reply stops it.
    on_reply: Name | None = None
    #: The no-reply path: a later step's id, or ``end``; none: the next step.
    on_timeout: Name | None = None


class Variant(_Def, kw_only=True):
    """One arm of an experiment."""

    name: Name
    weight: Weight = 1
    #: Where the variant's path starts: a later step's id, or ``end``.
    to: Name


class SplitStep(_Node, kw_only=True, tag="split", tag_field="kind"):
    """Send nothing: an experiment. Each contact is assigned a variant by weight, the same one every time
    for this sequence's experiment (re-publishing keeps it), recorded on the enrollment; the holdout gets
    nothing more (its enrollment completes, its conversions still counted)."""

    #: How long after the previous step the split is taken.
    delay_seconds: NonNegative = 0
    #: The experiment's name, unique in the sequence: its results and its assignments are kept by it.
    experiment: Name
    variants: Annotated[list[Variant], msgspec.Meta(min_length=1, max_length=MAX_VARIANTS)]
    #: The holdout's weight (0: none): contacts held out are sent nothing from here on.
    holdout_weight: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 0
    #: The variant chosen as the winner: everyone reaching the split takes it (none: still an experiment).
    winner: Name | None = None


#: A step that routes the enrollment and sends nothing.
ControlStep = BranchStep | WaitForReplyStep | SplitStep
#: Any step of a sequence.
Node = MessageStep | AiStep | BranchStep | WaitForReplyStep | SplitStep


class Goal(_Def, kw_only=True):
    """What the sequence is for: when ``event`` happens for the contact and ``conditions`` hold, its live
    enrollment ends ``converted`` at once (mid-delay too), and a finished one inside the conversion window
    counts a conversion."""

    name: Name
    event: Event
    #: In the rules' syntax, over the event (its payload's fields the event carries) and the contact.
    conditions: dict[str, Any] | None = None


class Exit(_Def, kw_only=True):
    """When to give up: when ``event`` happens for the contact and ``conditions`` hold, its live enrollment
    ends ``exited`` at once; with ``blocks_entry``, a contact for whom the conditions hold is not enrolled."""

    name: Name
    event: Event
    conditions: dict[str, Any] | None = None
    #: Refuse to enroll a contact for whom ``conditions`` hold (they may then name no event attribute).
    blocks_entry: bool = False


class StopFlags(_Def, kw_only=True):
    """What stops an enrollment; copied onto each enrollment when it is created."""

    reply: bool = True
    human_message: bool = True
    opt_out: bool = True
    lead_closed: bool = True
    conversation_resolved: bool = True


class Definition(_Def, kw_only=True):
    #: At least one to be published (a draft may have none yet).
    steps: Annotated[list[Node], msgspec.Meta(max_length=MAX_STEPS)] = msgspec.field(default_factory=list)
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
    goals: Annotated[list[Goal], msgspec.Meta(max_length=MAX_GOALS)] = msgspec.field(default_factory=list)
    exits: Annotated[list[Exit], msgspec.Meta(max_length=MAX_GOALS)] = msgspec.field(default_factory=list)
    #: How long after its last step a finished enrollment still counts a goal met as its conversion.
    conversion_window_seconds: Annotated[int, msgspec.Meta(ge=0, le=MAX_CONVERSION_WINDOW_SECONDS)] = (
        7 * 86400
    )

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
    for index, node in enumerate(definition.steps):
        where = f"{steps_field}.{index}"
        if isinstance(node, MessageStep | AiStep):
            _check_step(node, index, where, refusals)
        else:
            _check_control(node, definition, where, refusals)
            if index == 0 and isinstance(node, WaitForReplyStep):
                refusals.add(f"{where}.kind", "the first step cannot wait for a reply: nothing was sent yet")
    _check_paths(definition, steps_field, refusals)
    _check_criteria(definition, field, refusals)
    refusals.raise_any()
    return definition


def targets_of(node: Node) -> dict[str, str | None]:
    """Where a step may send the enrollment, keyed by field (``paths.0.to``, ``on_reply``): a later step's
    id, ``end``, or None (the next step; for ``on_reply``, a stop)."""
    if isinstance(node, BranchStep):
        return {f"paths.{i}.to": p.to for i, p in enumerate(node.paths)} | {"otherwise": node.otherwise}
    if isinstance(node, WaitForReplyStep):
        return {"on_reply": node.on_reply, "on_timeout": node.on_timeout}
    if isinstance(node, SplitStep):
        return {f"variants.{i}.to": v.to for i, v in enumerate(node.variants)}
    return {"next": node.next}


def _check_paths(definition: Definition, steps_field: str, refusals: Refusals) -> None:
    """Ids are unique; every path goes forward, to a later step's id or ``end`` (so a path never loops and a
    step runs at most once per enrollment); experiments are named once."""
    index_of: dict[str, int] = {}
    experiments: set[str] = set()
    for index, node in enumerate(definition.steps):
        where = f"{steps_field}.{index}"
        if node.id == END:
            refusals.add(f"{where}.id", f"{END} names the end of a path: choose another id")
        elif node.id is not None and node.id in index_of:
            refusals.add(f"{where}.id", f"id {node.id} is already step {index_of[node.id]}'s")
        elif node.id is not None:
            index_of[node.id] = index
        if isinstance(node, SplitStep):
            if node.experiment in experiments:
                refusals.add(f"{where}.experiment", f"experiment {node.experiment} is named twice")
            experiments.add(node.experiment)
    for index, node in enumerate(definition.steps):
        for name, target in targets_of(node).items():
            if target is None or target == END:
                continue
            found = index_of.get(target)
            if found is None:
                refusals.add(f"{steps_field}.{index}.{name}", f"no step has the id {target}")
            elif found <= index:
                refusals.add(
                    f"{steps_field}.{index}.{name}",
                    f"{target} is not after this step: a path goes forward, to a later step or {END}",
                )


def _unique(names: list[str], where: str, what: str, refusals: Refusals) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            refusals.add(f"{where}.{i}.name", f"{what} {name} is named twice")
        seen.add(name)


def _check_control(node: ControlStep, definition: Definition, where: str, refusals: Refusals) -> None:
    """A branch's paths (names, conditions), a wait's reply path, a split's variants and winner."""
    if isinstance(node, BranchStep):
        _unique([p.name for p in node.paths], f"{where}.paths", "path", refusals)
        for i, path in enumerate(node.paths):
            with refusals.check():
                parse_segment(path.when, f"{where}.paths.{i}.when")
    elif isinstance(node, WaitForReplyStep):
        if node.on_reply is None and not definition.stop_on.reply:
            refusals.add(
                f"{where}.on_reply",
                "without on_reply a reply stops the enrollment, and stop_on.reply is off: name the reply"
                f" path (a later step's id, or {END})",
            )
    else:
        _unique([v.name for v in node.variants], f"{where}.variants", "variant", refusals)
        if len(node.variants) < 2 and not node.holdout_weight:
            refusals.add(f"{where}.variants", "a split needs two variants, or one and a holdout")
        if node.winner is not None and node.winner not in {v.name for v in node.variants}:
            refusals.add(f"{where}.winner", f"no variant is named {node.winner}")


def _check_criteria(definition: Definition, field: str, refusals: Refusals) -> None:
    """Goals' and exits' names are unique; their conditions are valid for their event; an exit that blocks
    entry names no event attribute (it is read without one, when a contact is enrolled)."""
    prefix = f"{field}." if field else ""
    _unique([g.name for g in definition.goals], f"{prefix}goals", "goal", refusals)
    _unique([e.name for e in definition.exits], f"{prefix}exits", "exit", refusals)
    criteria: list[tuple[str, Goal | Exit]] = [
        *((f"{prefix}goals.{i}.conditions", g) for i, g in enumerate(definition.goals)),
        *((f"{prefix}exits.{i}.conditions", e) for i, e in enumerate(definition.exits)),
    ]
    for where, criterion in criteria:
        with refusals.check():
            if isinstance(criterion, Exit) and criterion.blocks_entry:
                parse_segment(criterion.conditions, where)
            else:
                check_event_fields(parse_conditions(criterion.conditions, where), criterion.event, where)


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
        if not isinstance(step, MessageStep | AiStep):
            continue
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


def step_due_at(step: Node, *, now: datetime, anchor_at: datetime | None) -> datetime | None:
    """When ``step`` is due if the previous step (or the enrollment) happened at ``now`` (a wait for a reply:
    when it times out).

    None for an anchor-timed step of an enrollment without an anchor: it is due now and will be skipped.
    """
    if isinstance(step, WaitForReplyStep):
        return now + timedelta(seconds=step.timeout_seconds)
    if isinstance(step, BranchStep | SplitStep) or step.anchor_offset_seconds is None:
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
        if isinstance(step, MessageStep | AiStep) and step.anchor_offset_seconds is not None:
            try:
                (anchor_at + timedelta(seconds=step.anchor_offset_seconds)).astimezone(UTC)
            except OverflowError:
                raise InvalidInput(
                    "anchor_at is too near the ends of the calendar for the steps' offsets", field=field
                ) from None
