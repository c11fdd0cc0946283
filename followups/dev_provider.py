"""``followups dev --fake-provider``: the fake WhatsApp Cloud API (:mod:`followups.fake_providers`)
in the dev process, a dev number wired to it (the project's default when it has none), and what
"reached the phone" in the log: each message the fake takes is logged, then reported back to the API's
webhook as Meta would (``sent``, ``delivered``, ``read``, signed with the app secret), so its status moves
on the contact card as it would with a real number.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Final

from followups.fake_providers import FakeGraph, Taken
from libs.common.channels.setup import WhatsAppCloudSetup, set_channel, webhook_path
from libs.common.core.runtime import Runtime
from libs.common.platform.numbers import (
    NumberCreate,
    NumberUpdate,
    create_number,
    list_numbers,
    update_number,
)

log = logging.getLogger("followups.dev")

#: The dev number on the fake provider: its phone, its Graph phone-number id and its (fake) credentials.
DEV_PHONE: Final = "+15550100000"
DEV_PHONE_NUMBER_ID: Final = "100000000000001"
DEV_ACCESS_TOKEN: Final = "dev-fake-access-token"
DEV_APP_SECRET: Final = "dev-fake-app-secret"
DEV_VERIFY_TOKEN: Final = "dev-fake-verify-token"
#: Seconds between the statuses the fake reports of a message (sent, delivered, read).
STATUS_GAP_SECONDS: Final = 1.0


def wire_dev_number(runtime: Runtime, project_id: uuid.UUID) -> uuid.UUID:
    """The dev number (made once), on the fake provider, the project's default when it has none."""
    now = runtime.clock.now()
    with runtime.pool.connection() as conn:
        numbers = list_numbers(conn, project_id, limit=1000)
        number = next((n for n in numbers if n.phone == DEV_PHONE), None)
        if number is None:
            number = create_number(
                conn, project_id, NumberCreate(phone=DEV_PHONE, name="fake WhatsApp"), now=now
            )
        if not any(n.is_default for n in numbers):
            update_number(conn, project_id, number.id, NumberUpdate(is_default=True), now=now)
        setup = WhatsAppCloudSetup(
            phone_number_id=DEV_PHONE_NUMBER_ID,
            access_token=DEV_ACCESS_TOKEN,
            app_secret=DEV_APP_SECRET,
            verify_token=DEV_VERIFY_TOKEN,
        )
        set_channel(conn, project_id, number.id, setup, now=now)
    return number.id


def report_to(graph: FakeGraph, api: str, number_id: uuid.UUID) -> None:
    """Log each message the fake takes, then report its statuses to the API's webhook for the number."""
    url = api + webhook_path("whatsapp_cloud", number_id)
    stopping = graph.stopping

    def statuses(taken: Taken) -> None:
        for status in ("sent", "delivered", "read"):
            if stopping.wait(STATUS_GAP_SECONDS):
                return
            try:
                answer = graph.status(url, taken, status)
                if answer.status_code != 200:
                    log.warning(
                        "fake provider: status not taken",
                        extra={"status": status, "code": answer.status_code},
                    )
            except Exception as exc:
                log.warning("fake provider: status not reported", extra={"status": status, "error": str(exc)})
                return

    def reached(taken: Taken) -> None:
        request = taken.request
        content = request.get(request.get("type", ""), {})
        text = content.get("body") or content.get("caption") or content.get("name") or content.get("link")
        log.info(
            "reached the phone (fake WhatsApp)",
            extra={
                "to": "+" + str(request.get("to")),
                "type": request.get("type"),
                "text": text,
                "wamid": taken.id,
            },
        )
        threading.Thread(target=statuses, args=(taken,), name="fake-statuses", daemon=True).start()

    graph.on_taken = reached
