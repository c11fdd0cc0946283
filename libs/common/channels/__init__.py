"""Channels: the providers a sending number sends through (WhatsApp Cloud API, Twilio's Messages API).

Outbound, the send lane (:mod:`~libs.common.channels.send_lane`, run by ``followups worker send-lane``)
claims QUEUED messages number by number and sends each through its number's provider adapter
(:mod:`~libs.common.channels.whatsapp`, :mod:`~libs.common.channels.twilio`); inbound, each provider's
webhook (:mod:`~libs.common.channels.inbound`) is checked by its signature and turned into the platform
events every other path produces (a reply, a status, an opt-out), applied by :mod:`libs.common.ingress`.
A number's provider, ids and credentials (write-only) are :mod:`~libs.common.channels.setup`'s.

The providers' base URLs are operator settings (``WHATSAPP_GRAPH_URL``, ``TWILIO_API_URL``), never a
tenant's: the send lane is no way into the service's own network.

Owns: ``channel_numbers``, ``channel_sends``.
May import: every context (it sits above :mod:`libs.common.ingress`), ``core``, ``contracts``.
"""

from __future__ import annotations

from typing import Final

#: The tables this context owns: it alone writes them (``tests/test_table_ownership.py`` checks it).
OWNS: Final = frozenset({"channel_numbers", "channel_sends"})
