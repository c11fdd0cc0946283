"""What the channel tests share: a runtime whose providers are the fakes, numbers wired to them, queued
messages, and a send lane driven tick by tick."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from followups.fake_providers import FakeGraph, FakeTwilio
from libs.common.channels.send_lane import SendLane
from libs.common.channels.setup import TwilioSetup, WhatsAppCloudSetup, set_channel
from libs.common.core.runtime import Runtime
from libs.common.platform import messages
from libs.common.platform.numbers import NumberCreate, create_number
from services.send_lane.service import providers
from tests.factories import new_phone
from tests.helpers import rows, wait_until

#: The API's public address in these tests (Twilio signs the URL it called there).
PUBLIC_URL = "https://followups.example.com"
APP_SECRET = "fake-app-secret"
VERIFY_TOKEN = "fake-verify-token"
AUTH_TOKEN = "fake-auth-token"
ACCOUNT_SID = "AC" + "0" * 32


def with_providers(
    runtime: Runtime, graph: FakeGraph | None = None, twilio: FakeTwilio | None = None, **channels: Any
) -> Runtime:
    """``runtime`` with its providers' URLs pointed at the fakes (and other channel settings)."""
    settings = runtime.settings.channels
    changes: dict[str, Any] = {"public_url": PUBLIC_URL, "timeout_seconds": 1.0} | channels
    if graph is not None:
        changes["whatsapp_graph_url"] = graph.graph_url
    if twilio is not None:
        changes["twilio_api_url"] = twilio.url
    settings = msgspec.structs.replace(settings, **changes)
    return dataclasses.replace(runtime, settings=dataclasses.replace(runtime.settings, channels=settings))


def whatsapp_number(
    pool: ConnectionPool, runtime: Runtime, project_id: uuid.UUID, graph: FakeGraph
) -> tuple[uuid.UUID, str]:
    """A number on the fake Graph API: its id and its phone-number id."""
    phone_number_id = str(uuid.uuid4().int)[:15]
    now = runtime.clock.now()
    with pool.connection() as conn:
        number = create_number(conn, project_id, NumberCreate(phone=new_phone()), now=now)
        setup = WhatsAppCloudSetup(
            phone_number_id=phone_number_id,
            access_token=graph.secret,
            app_secret=graph.app_secret,
            verify_token=VERIFY_TOKEN,
        )
        set_channel(conn, project_id, number.id, setup, now=now)
    return number.id, phone_number_id


def twilio_number(
    pool: ConnectionPool, runtime: Runtime, project_id: uuid.UUID, twilio: FakeTwilio
) -> uuid.UUID:
    now = runtime.clock.now()
    with pool.connection() as conn:
        phone = new_phone()
        number = create_number(conn, project_id, NumberCreate(phone=phone), now=now)
        setup = TwilioSetup(
            account_sid=twilio.account_sid, auth_token=twilio.secret, sender=f"whatsapp:{phone}"
        )
        set_channel(conn, project_id, number.id, setup, now=now)
    return number.id


def queue(
    pool: ConnectionPool,
    runtime: Runtime,
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    number_id: uuid.UUID,
    body: str | None = "Hello",
    **fields: Any,
) -> uuid.UUID:
    """A QUEUED outbound message of the contact on the number."""
    with pool.connection() as conn:
        queued = messages.queue_contact_message(
            conn,
            messages.OutboundMessage(
                project_id=project_id,
                contact_id=contact_id,
                body=body,
                source="api",
                number_id=number_id,
                **fields,
            ),
            now=runtime.clock.now(),
        )
    return queued.message_id


def status(pool: ConnectionPool, message_id: uuid.UUID) -> tuple[Any, ...]:
    """(status, provider_message_id, error_code) of a message."""
    return rows(
        pool, "SELECT status, provider_message_id, error_code FROM messages WHERE id = %s", message_id
    )[0]


def send_state(pool: ConnectionPool, message_id: uuid.UUID) -> Any:
    """(state, attempts, last_error) of a message's send, None when it has none (settled)."""
    found = rows(
        pool, "SELECT state, attempts, last_error FROM channel_sends WHERE message_id = %s", message_id
    )
    return found[0] if found else None


@contextmanager
def send_lane(runtime: Runtime) -> Iterator[SendLane]:
    lane = SendLane(runtime, providers(runtime))
    try:
        yield lane
    finally:
        lane.close()
        lane.providers.close()


def idle(lane: SendLane) -> bool:
    """Whether every send this lane started is recorded."""
    with lane._lock:
        return lane._busy == 0


def drain(lane: SendLane) -> int:
    """Tick until a tick starts nothing and every send is recorded; returns the sends started."""
    started = 0
    while True:
        n = lane.tick()
        started += n
        wait_until(lambda: idle(lane), what="the sends recorded")
        if n == 0:
            return started


def through(client: TestClient[Any]) -> Any:
    """A fake provider's poster that POSTs its webhooks through the test client (public URL stripped)."""

    def post(url: str, body: bytes, headers: dict[str, str]) -> Any:
        return client.post(url.removeprefix(PUBLIC_URL), content=body, headers=headers)

    return post
