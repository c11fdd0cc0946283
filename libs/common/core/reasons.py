"""A recorded reason: a closed code and, for some codes, a detail (``only_if`` and the condition not met,
``missing_variable`` and the placeholder's path), kept in one text column as ``code`` or ``code:detail``
and answered as two fields (``reason`` and ``reason_detail``, ``skip_reason`` and ``skip_detail``).

A writer takes its code typed, a ``Literal`` of the context that owns the column (mypy refuses a code that
is not listed), and its detail; :func:`stored` joins them. A read splits what is stored with :func:`split`:
a code the reader does not list (a row written by an older or a newer version) is answered as
:data:`OTHER` with the stored text whole as its detail, so no row fails to read and no answer leaves its
enum.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final, Literal, TypeVar, cast

#: The code a read answers for a stored code it does not list.
Other = Literal["other"]
OTHER: Final[Other] = "other"

_Code = TypeVar("_Code", bound=str)


def stored(code: str, detail: str | None = None) -> str:
    """The text a column keeps: ``code``, or ``code:detail``."""
    return code if detail is None else f"{code}:{detail}"


def split(text: str | None, codes: Collection[_Code]) -> tuple[_Code | Other | None, str | None]:
    """The code and the detail of what :func:`stored` wrote (None, None for nothing); a code not among
    ``codes`` is :data:`OTHER`, with ``text`` as its detail."""
    if text is None:
        return None, None
    code, colon, detail = text.partition(":")
    if code in codes:
        return cast(_Code, code), detail if colon else None
    return OTHER, text


# --- the WhatsApp policy's codes (docs/providers.md, "What a failure changes") -----------------------------

#: The class of a provider's error code (:mod:`libs.common.platform.provider_errors`), the label of
#: ``followups_provider_errors_total``: the user's own marketing limit (131049), outside the 24-hour
#: service window (131047, Twilio 470 and 63016), undeliverable (131026, Twilio 63003 and 21211), the
#: number rate-limited (130429), any other code (recorded and counted only).
ProviderErrorClass = Literal[
    "marketing_limit", "outside_service_window", "undeliverable", "rate_limit", "other"
]

#: What the engine did about a provider's failure, in the message's timeline (its status event's
#: ``action``, with a detail): the contact's marketing follow-ups deferred (detail: until when), the step
#: retried as its approved template (detail: the new message's id), the step skipped
#: (``outside_service_window``), the contact flagged undeliverable and its follow-ups stopped (detail: how
#: many), the message queued again with its number's pacing widened (detail: the gap in ms), or nothing
#: but the record.
ProviderAction = Literal[
    "marketing_deferred", "template_retry", "step_skipped", "contact_undeliverable", "requeued", "recorded"
]

#: Why an enrollment waits (beside the sending constraints' own): the contact's marketing messages refused
#: by the provider for a day (131049), the contact sent a message less than ``min_recipient_gap_seconds``
#: ago, the contact's cap of marketing messages per calendar day (in its zone) reached, the number's business
#: portfolio at its tier's limit of new recipients in 24 h (or the number at its share of it).
PolicyWaitingReason = Literal["user_marketing_limit", "recipient_gap", "contact_day_cap", "messaging_limit"]

#: Why a marketing message is held back (a follow-up deferred, a rule's message refused): the contact's
#: cap per rolling 24 hours, or per calendar day in its zone, reached
#: (:func:`~libs.common.followups.constraints.frequency_cap`).
FrequencyCap = Literal["contact_cap", "contact_day_cap"]

#: Why an enrollment stopped (beside the stop paths' own): the provider cannot deliver to the contact.
PolicyStopReason = Literal["undeliverable"]
