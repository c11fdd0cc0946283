"""A project's follow-up settings (``followup_settings``): the sending constraints the release path obeys
and how long finished follow-ups are kept. A project without a row has the defaults, which constrain
nothing but the spacing of messages to one contact (``min_recipient_gap_seconds``, 6 s): every other
constraint is opt-in.

The release path reads them in the same statement that locks the contact, so a change takes effect at
the next release in every process (no cache to invalidate).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from libs.common.core import validation
from libs.common.core.errors import Refusals
from libs.common.core.sql import load_queries
from libs.common.followups.send_window import SendWindow, validate_window
from libs.common.platform import projects

QUERIES = load_queries("libs.common.followups", "project_settings.sql")

#: Longest pacing gap between two follow-ups on one number (an hour).
MAX_SEND_DELAY_MS = 3_600_000


#: The most one message may cost (in the project's currency).
MAX_MESSAGE_PRICE = 100.0
Price = Annotated[float, msgspec.Meta(ge=0, le=MAX_MESSAGE_PRICE)]


class MessagePrices(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What the provider charges the project for one template message of each category (WhatsApp prices
    template messages by category and country; free-form messages in the service window are free)."""

    marketing: Price = 0.0
    utility: Price = 0.0
    service: Price = 0.0
    #: The prices' currency (ISO 4217).
    currency: Annotated[str, msgspec.Meta(pattern="^[A-Z]{3}$")] = "USD"


class ProjectSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Every field has a default that constrains nothing; ``PUT /v1/settings`` replaces them all (the time
    zone only when given)."""

    #: The project's IANA time zone (default UTC): its send windows and anchor times for a contact without
    #: a zone of its own, and its business hours. Left out of a ``PUT``, it stays as it is.
    timezone: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | msgspec.UnsetType = msgspec.UNSET
    #: Local hours and days follow-ups may go out in (null: any time); a sequence or step may override it.
    send_window: SendWindow | None = None
    #: ``required``: a contact whose consent is not ``granted`` is skipped (``no_consent``).
    consent_mode: Literal["off", "required"] = "off"
    #: ``enforced``: a free-form step to a contact who has not written in 24 h is sent as its approved
    #: template, or skipped (``outside_service_window``). WhatsApp Business numbers need ``enforced``.
    service_window: Literal["off", "enforced"] = "off"
    #: Most messages the engine sends one contact in any 24 hours (follow-ups, one-offs, AI steps, rules'
    #: messages: all are counted), past which a marketing one is held back (a follow-up deferred
    #: ``contact_cap``, a rule's refused); utility and service messages pass (null: no cap).
    max_per_contact_24h: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    #: The same per calendar day in the contact's zone (else the project's): held back until its midnight
    #: (``contact_day_cap``).
    max_per_contact_day: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    #: Pacing: the least time between two follow-ups released on one number.
    send_delay_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEND_DELAY_MS)] = 0
    #: The least time between two messages to one contact, whatever sent them (a sequence, a rule, a
    #: one-off, an AI step): WhatsApp paces a user at about one message per 6 seconds. 0: no spacing.
    min_recipient_gap_seconds: Annotated[int, msgspec.Meta(ge=0, le=86400)] = 6
    #: Most follow-ups QUEUED or PROCESSING on one number at a time (null: no limit).
    max_in_flight_per_number: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    #: Most messages the project queues in a calendar month (UTC) (null: no quota).
    monthly_message_quota: Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)] | None = None
    #: Most of the project's messages waiting QUEUED for the send lane before follow-ups hold back.
    max_send_lane_backlog: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] | None = None
    #: Days finished enrollments are kept.
    retention_days: Annotated[int, msgspec.Meta(ge=1, le=3650)] = 90
    #: The project's business hours (in its time zone): a rule may count its delay in them only.
    business_hours: SendWindow | None = None
    #: Most model tokens the project's AI steps use in a calendar month (UTC); over it, AI steps take their
    #: fallback (``ai_budget_exhausted``) without calling the model. Null: no budget, or the operator's cap
    #: (``AI_MAX_MONTHLY_TOKENS_PER_PROJECT``) when one is set; a budget may not exceed the cap.
    ai_monthly_token_budget: Annotated[int, msgspec.Meta(ge=1, le=10_000_000_000)] | None = None
    #: The price of a template message by category: a sequence's statistics show its monthly spend (null:
    #: no prices, no spend shown).
    message_prices: MessagePrices | None = None


#: What a project without a settings row has.
DEFAULTS = ProjectSettings()


def settings_from_row(row: dict[str, Any] | None) -> ProjectSettings:
    """Settings from the columns of ``followup_settings`` and the project's ``timezone`` (no settings row:
    the defaults)."""
    if row is None:
        return DEFAULTS
    if not row.get("has_settings", True):
        return msgspec.structs.replace(DEFAULTS, timezone=row["timezone"])
    return msgspec.convert(
        {k: v for k, v in row.items() if k in ProjectSettings.__struct_fields__}, ProjectSettings
    )


def get_settings(conn: Connection[Any], project_id: uuid.UUID) -> ProjectSettings:
    """The project's settings, with its time zone."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(QUERIES["get_settings"], {"project_id": project_id}).fetchone()
    return settings_from_row(row)


def ai_token_budget(budget: int | None, cap: int | None) -> int | None:
    """The monthly tokens a project's AI steps may use: its ``ai_monthly_token_budget``, never more than
    the operator's cap (a budget stored above a cap lowered since is held to the cap; none set: the cap);
    None: no limit at all."""
    if budget is None or cap is None:
        return cap if budget is None else budget
    return min(budget, cap)


def put_settings(
    conn: Connection[Any],
    project_id: uuid.UUID,
    settings: ProjectSettings,
    *,
    now: datetime,
    ai_token_cap: int | None,
) -> ProjectSettings:
    """Replace the project's settings (checked first by :func:`check_settings`: nothing is stored half) and
    set its time zone when given (the platform owns it); returns them as stored."""
    check_settings(settings, ai_token_cap=ai_token_cap)
    params = msgspec.to_builtins(settings) | {"project_id": project_id, "now": now}
    for name in ("send_window", "business_hours", "message_prices"):
        params[name] = Jsonb(params[name]) if params[name] is not None else None
    conn.execute(QUERIES["put_settings"], params)
    if isinstance(settings.timezone, str):
        projects.set_timezone(conn, project_id, settings.timezone)
    return get_settings(conn, project_id)


def check_settings(settings: ProjectSettings, *, ai_token_cap: int | None) -> None:
    """The checks settings must pass, every error at once (one InvalidInput): an IANA time zone, windows
    that can open, a budget within ``ai_token_cap``, the operator's cap
    (``AI_MAX_MONTHLY_TOKENS_PER_PROJECT``)."""
    refusals = Refusals()
    if isinstance(settings.timezone, str):
        with refusals.check():
            validation.timezone(settings.timezone)
    budget = settings.ai_monthly_token_budget
    if ai_token_cap is not None and budget is not None and budget > ai_token_cap:
        refusals.add(
            "ai_monthly_token_budget",
            f"ai_monthly_token_budget may be at most {ai_token_cap} (this deployment's cap on a project's"
            " monthly tokens); leave it empty to use the cap",
        )
    for name in ("send_window", "business_hours"):
        window = getattr(settings, name)
        if window is not None:
            with refusals.check():
                validate_window(window, name)
    refusals.raise_any()
