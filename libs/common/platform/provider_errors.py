"""The providers' error codes the engine acts on, by class (the table in docs/providers.md, "What a failure
changes"): a ``message.status`` ``FAILED`` carries the provider's ``error_code``, and
:func:`classify` says which :data:`~libs.common.core.reasons.ProviderErrorClass` it is. What each class
does is :mod:`libs.common.ingress.provider_feedback`'s.
"""

from __future__ import annotations

from typing import Final

from libs.common.core.reasons import ProviderErrorClass

#: Each code the engine acts on (WhatsApp Cloud API's Graph codes, Twilio's error codes), by class; any
#: other is ``other``: recorded and counted, nothing else.
CODES: Final[dict[str, ProviderErrorClass]] = {
    "131049": "marketing_limit",  # WhatsApp: not delivered, to keep the user's engagement healthy
    "131047": "outside_service_window",  # WhatsApp: re-engagement message, 24 h since the user wrote
    "470": "outside_service_window",  # Twilio (legacy): outside the 24 h window
    "63016": "outside_service_window",  # Twilio: outside the 24 h window, a template needed
    "131026": "undeliverable",  # WhatsApp: not a WhatsApp user, or cannot receive
    "63003": "undeliverable",  # Twilio: the channel could not find the recipient
    "21211": "undeliverable",  # Twilio: invalid 'To' number
    "130429": "rate_limit",  # WhatsApp: the number's throughput limit reached
}


def classify(code: str | None) -> ProviderErrorClass:
    """The class of a provider's error code (``other`` for none or one not listed)."""
    return CODES.get(code or "", "other")
