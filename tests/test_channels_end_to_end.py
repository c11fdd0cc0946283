"""End to end through the fake WhatsApp Cloud API: enroll, the send lane sends the first step, Meta's
webhook reports it delivered and read, the contact replies through the webhook, and the rest of the
sequence never goes."""

from __future__ import annotations

from datetime import timedelta

from followups.fake_providers import fake_graph
from libs.common.channels.setup import webhook_path
from libs.common.followups.definition import MessageStep
from libs.common.platform.numbers import NumberUpdate, update_number
from tests.channel_helpers import (
    APP_SECRET,
    drain,
    send_lane,
    status,
    through,
    whatsapp_number,
    with_providers,
)
from tests.conftest import client_of
from tests.factories import make_contact, make_enrollment
from tests.release_helpers import release_all, sequence, state


def test_a_reply_through_the_webhook_stops_the_sequence_after_its_first_step_reached_the_phone(
    pool, runtime, clock, project, api_app
):
    with fake_graph(app_secret=APP_SECRET) as graph:
        runtime = with_providers(runtime, graph)
        # Given a project whose default number is on the (fake) WhatsApp Cloud API
        number_id, phone_number_id = whatsapp_number(pool, runtime, project.id, graph)
        with pool.connection() as conn:
            update_number(conn, project.id, number_id, NumberUpdate(is_default=True), now=clock.now())
        seq = sequence(
            pool,
            project.id,
            MessageStep(text="Hi! Did you see the quote?"),
            MessageStep(text="Just checking in", delay_seconds=86400),
        )
        contact_id = make_contact(pool, project.id, phone="+15557654321")
        enrollment = make_enrollment(pool, clock, project.id, seq, contact_id)
        url = webhook_path("whatsapp_cloud", number_id)

        with client_of(api_app, runtime) as client, send_lane(runtime) as lane:
            graph.poster = through(client)
            # When the first step is released and the send lane sends it
            assert release_all(pool, clock) == 1
            assert drain(lane) == 1
            [taken] = graph.taken
            assert taken.request["to"] == "15557654321"
            assert taken.request["text"]["body"] == "Hi! Did you see the quote?"
            message_id = taken.request["biz_opaque_callback_data"]

            # And Meta reports it delivered, then read
            for reported in ("sent", "delivered", "read"):
                assert graph.status(url, taken, reported).status_code == 200
            assert status(pool, message_id) == ("READ", taken.id, None)

            # And the contact replies
            replied = graph.reply(url, phone_number_id, "+15557654321", "Yes, thanks! Let's talk")
            assert replied.status_code == 200 and replied.json()["applied"] == 1

            # Then the enrollment stopped on the reply, and a day later nothing more goes out
            assert state(pool, enrollment.id)[:2] == ("stopped", "replied")
            clock.advance(timedelta(days=2))
            assert release_all(pool, clock) == 0
            assert drain(lane) == 0
        assert len(graph.taken) == 1
