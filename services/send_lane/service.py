"""Wiring of the send-lane service: the providers' client and the polling loop that claims and sends
(:class:`libs.common.channels.send_lane.SendLane`); each finished send wakes the loop to fill its slot."""

from __future__ import annotations

from libs.common.channels.providers import Adapter, Providers
from libs.common.channels.send_lane import SendLane, callback_url
from libs.common.channels.twilio import TwilioMessages
from libs.common.channels.whatsapp import WhatsAppCloud
from libs.common.contracts import actors
from libs.common.core.loops import PollingLoop
from libs.common.core.runtime import Runtime, Service

#: Name of the send lane's polling loop.
SEND_LANE_LOOP = "send-lane"


def providers(runtime: Runtime) -> Providers:
    """The providers' client of this process, with every adapter."""
    settings = runtime.settings.channels
    adapters: dict[str, Adapter] = {"whatsapp_cloud": WhatsAppCloud(), "twilio": TwilioMessages()}
    return Providers(settings, adapters, callback_url=callback_url(settings.public_url))


def build(runtime: Runtime) -> Service:
    worker = runtime.settings.worker
    loops: list[PollingLoop] = []
    lane = SendLane(runtime, providers(runtime), wake=lambda: loops[0].wake())
    loop = PollingLoop(
        SEND_LANE_LOOP,
        lane.tick,
        poll_interval=worker.poll_interval_seconds,
        # QUEUED messages are announced by no nudge: look every poll interval, never back off further
        idle_max_sleep=worker.poll_interval_seconds,
    )
    loops.append(loop)
    return Service("send-lane", actors.SEND_LANE_QUEUE, loops)
