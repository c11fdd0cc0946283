"""The send lane against the fake providers: what goes out (the providers' documented shapes), what comes
of each answer (sent, throttled, refused, lost), at most once, within the bounds per number, fair across
projects."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit

import pytest

from followups.fake_providers import closed_port, fake_graph, fake_twilio
from libs.common.channels.send_lane import share
from tests.channel_helpers import (
    PUBLIC_URL,
    drain,
    queue,
    send_lane,
    send_state,
    status,
    twilio_number,
    whatsapp_number,
    with_providers,
)
from tests.factories import make_contact
from tests.helpers import rows, wait_until


@pytest.fixture
def graph():
    with fake_graph() as fake:
        yield fake


@pytest.fixture
def twilio():
    with fake_twilio() as fake:
        yield fake


def test_a_text_goes_out_through_the_graph_api_once_and_is_sent_with_its_wamid(pool, runtime, project, graph):
    runtime = with_providers(runtime, graph)
    number_id, phone_number_id = whatsapp_number(pool, runtime, project.id, graph)
    contact_id = make_contact(pool, project.id, phone="+15550001111")
    message_id = queue(pool, runtime, project.id, contact_id, number_id, "Hi Ana")

    with send_lane(runtime) as lane:
        assert drain(lane) == 1
        assert drain(lane) == 0  # nothing goes twice

    [taken] = graph.taken
    assert taken.account == phone_number_id
    assert taken.request == {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": "15550001111",
        "biz_opaque_callback_data": str(message_id),
        "type": "text",
        "text": {"preview_url": False, "body": "Hi Ana"},
    }
    assert status(pool, message_id) == ("SENT", taken.id, None)
    assert send_state(pool, message_id) is None
    history = rows(
        pool, "SELECT status FROM message_status_events WHERE message_id = %s ORDER BY id", message_id
    )
    assert [s for (s,) in history] == ["QUEUED", "PROCESSING", "SENT"]


def test_templates_and_media_go_in_the_graph_api_shapes(pool, runtime, project, graph):
    runtime = with_providers(runtime, graph)
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    contact_id = make_contact(pool, project.id)
    queue(
        pool,
        runtime,
        project.id,
        contact_id,
        number_id,
        None,
        template_name="quote_reminder",
        template_language="pt_BR",
        template_parameters=["Ana", "R$ 120"],
    )
    queue(
        pool,
        runtime,
        project.id,
        contact_id,
        number_id,
        "the quote",
        media_url="https://cdn.example.com/q.pdf",
        media_kind="document",
    )
    queue(
        pool,
        runtime,
        project.id,
        contact_id,
        number_id,
        "ignored",
        media_url="https://cdn.example.com/a.ogg",
        media_kind="audio",
    )

    with send_lane(runtime) as lane:
        assert drain(lane) == 3

    by_type = {t.request["type"]: t.request for t in graph.taken}
    assert by_type["template"]["template"] == {
        "name": "quote_reminder",
        "language": {"code": "pt_BR"},
        "components": [
            {
                "type": "body",
                "parameters": [{"type": "text", "text": "Ana"}, {"type": "text", "text": "R$ 120"}],
            }
        ],
    }
    assert by_type["document"]["document"] == {
        "link": "https://cdn.example.com/q.pdf",
        "caption": "the quote",
    }
    assert by_type["audio"]["audio"] == {"link": "https://cdn.example.com/a.ogg"}  # no caption on audio


def test_twilio_gets_its_form_with_a_status_callback_and_content_templates(pool, runtime, project, twilio):
    runtime = with_providers(runtime, twilio=twilio)
    number_id = twilio_number(pool, runtime, project.id, twilio)
    contact_id = make_contact(pool, project.id, phone="+15550002222")
    text_id = queue(pool, runtime, project.id, contact_id, number_id, "Hi Bo")
    template_id = queue(
        pool,
        runtime,
        project.id,
        contact_id,
        number_id,
        None,
        template_name="HX" + "1" * 32,
        template_parameters=["Bo"],
    )

    with send_lane(runtime) as lane:
        assert drain(lane) == 2

    by_to = {t.request.get("Body", "template"): t for t in twilio.taken}
    text = by_to["Hi Bo"].request
    assert text["To"] == "whatsapp:+15550002222" and text["From"].startswith("whatsapp:+")
    callback = urlsplit(text["StatusCallback"])
    assert f"{callback.scheme}://{callback.netloc}" == PUBLIC_URL
    assert callback.path == f"/v1/providers/twilio/{number_id}/webhook"
    assert dict(parse_qsl(callback.query)) == {"message_id": str(text_id)}
    template = by_to["template"].request
    assert template["ContentSid"] == "HX" + "1" * 32 and json.loads(template["ContentVariables"]) == {
        "1": "Bo"
    }
    assert status(pool, text_id)[:2] == ("SENT", by_to["Hi Bo"].id)
    assert status(pool, template_id)[:2] == ("SENT", by_to["template"].id)


@pytest.mark.parametrize("failure", ["throttle", "unreachable"])
def test_a_throttled_or_unreached_send_is_retried_after_its_backoff(
    pool, runtime, clock, project, graph, failure
):
    runtime = with_providers(runtime, graph)
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    message_id = queue(pool, runtime, project.id, make_contact(pool, project.id), number_id)
    if failure == "throttle":
        graph.mode = "throttle"
        first = runtime
    else:  # nothing listens where the provider should be
        first = with_providers(runtime, whatsapp_graph_url=f"http://127.0.0.1:{closed_port()}/v21.0")

    with send_lane(first) as lane:
        assert drain(lane) == 1
        state, attempts, error = send_state(pool, message_id)
        assert (state, attempts) == ("retry", 1)
        assert error == ("throttled_130429" if failure == "throttle" else "connect_error")
        assert status(pool, message_id)[0] == "PROCESSING"  # claimed: a reply no longer cancels it
        assert drain(lane) == 0  # not due yet
    graph.mode = "accept"
    clock.advance(timedelta(seconds=3))
    with send_lane(runtime) as lane:
        assert drain(lane) == 1

    assert len(graph.taken) == 1
    assert status(pool, message_id)[:2] == ("SENT", graph.taken[0].id)
    assert send_state(pool, message_id) is None


@pytest.mark.parametrize(
    ("failure", "error"), [("fail", "http_500"), ("stall", "timeout"), ("drop", "connection_lost")]
)
def test_an_answer_lost_after_sending_is_never_sent_again(
    pool, runtime, clock, project, graph, failure, error
):
    runtime = with_providers(runtime, graph)
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    message_id = queue(pool, runtime, project.id, make_contact(pool, project.id), number_id)
    graph.mode = failure
    graph.stall_seconds = 2.0  # twice the send lane's deadline here

    with send_lane(runtime) as lane:
        assert drain(lane) == 1
        assert send_state(pool, message_id) == ("unconfirmed", 1, error)
        graph.mode = "accept"
        clock.advance(timedelta(hours=1))
        assert drain(lane) == 0  # it waits for a status: nothing goes again
        assert graph.requests == 1
        assert status(pool, message_id)[0] == "PROCESSING"
        # Then its lifetime ends without a status: it is FAILED as unconfirmed
        clock.advance(timedelta(days=1))
        lane.tick()

    assert status(pool, message_id) == ("FAILED", None, "unconfirmed")
    assert send_state(pool, message_id) is None


def test_a_refusal_fails_the_message_with_the_providers_code(pool, runtime, project, graph, twilio):
    runtime = with_providers(runtime, graph, twilio)
    wa_number, _ = whatsapp_number(pool, runtime, project.id, graph)
    tw_number = twilio_number(pool, runtime, project.id, twilio)
    contact_id = make_contact(pool, project.id)
    wa_message = queue(pool, runtime, project.id, contact_id, wa_number)
    tw_message = queue(pool, runtime, project.id, contact_id, tw_number)
    graph.mode = twilio.mode = "reject"

    with send_lane(runtime) as lane:
        assert drain(lane) == 2

    assert status(pool, wa_message) == ("FAILED", None, "131026")
    assert status(pool, tw_message) == ("FAILED", None, "63016")
    [error] = rows(pool, "SELECT error FROM messages WHERE id = %s", wa_message)[0]
    assert "Receiver is incapable" in error
    [data] = rows(
        pool, "SELECT data FROM outbox WHERE aggregate_id = %s AND type = 'message.failed'", wa_message
    )[0]
    assert data["error_code"] == "131026"


def test_retries_end_with_the_messages_lifetime(pool, runtime, clock, project, graph):
    runtime = with_providers(runtime, graph, message_lifetime_seconds=60.0)
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    message_id = queue(pool, runtime, project.id, make_contact(pool, project.id), number_id)
    graph.mode = "throttle"

    with send_lane(runtime) as lane:
        for _ in range(10):
            drain(lane)
            clock.advance(timedelta(seconds=20))
            if status(pool, message_id)[0] == "FAILED":
                break

    assert status(pool, message_id) == ("FAILED", None, "expired")
    assert 1 < graph.requests < 10
    assert graph.taken == []


def test_a_send_whose_worker_died_is_unconfirmed_not_resent(pool, runtime, clock, project, graph):
    runtime = with_providers(runtime, graph)
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    message_id = queue(pool, runtime, project.id, make_contact(pool, project.id), number_id)
    graph.mode, graph.stall_seconds = "stall", 1.5

    with send_lane(runtime) as dying, send_lane(runtime) as other:
        assert dying.tick() == 1  # its request is out; the worker "dies" (its answer comes too late)
        clock.advance(timedelta(seconds=30))  # past the lease
        assert other.tick() == 0
        assert send_state(pool, message_id)[0] == "unconfirmed"
        wait_until(lambda: dying._busy == 0, what="the late answer")

    assert send_state(pool, message_id) == (
        "unconfirmed",
        1,
        "lease_expired",
    )  # the late outcome changed nothing
    assert graph.requests == 1


def test_sends_in_flight_per_number_stay_within_the_bound_across_replicas(pool, runtime, project, graph):
    runtime = with_providers(runtime, graph, number_concurrency=3, concurrency=16)
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    contact_id = make_contact(pool, project.id)
    ids = [queue(pool, runtime, project.id, contact_id, number_id, f"m{i}") for i in range(12)]
    graph.latency = 0.2

    with send_lane(runtime) as one, send_lane(runtime) as two:

        def all_sent() -> bool:
            one.tick()
            two.tick()
            return all(status(pool, i)[0] == "SENT" for i in ids)

        wait_until(all_sent, timeout=30, interval=0.05, what="every message sent")

    assert len(graph.taken) == 12
    assert 1 < graph.max_in_flight <= 3


def test_one_projects_backlog_does_not_hold_back_anothers_first_message(
    pool, runtime, project, other_project, graph
):
    runtime = with_providers(runtime, graph, batch=10)
    busy_number, _ = whatsapp_number(pool, runtime, project.id, graph)
    quiet_number, _ = whatsapp_number(pool, runtime, other_project.id, graph)
    busy_contact = make_contact(pool, project.id)
    for i in range(100):
        queue(pool, runtime, project.id, busy_contact, busy_number, f"bulk {i}")
    first = queue(
        pool, runtime, other_project.id, make_contact(pool, other_project.id), quiet_number, "first"
    )

    with send_lane(runtime) as lane:
        lane.tick()
        wait_until(lambda: lane._busy == 0, what="the first batch")

    assert status(pool, first)[0] == "SENT"
    assert len(graph.taken) <= 10


def test_free_slots_go_to_each_project_in_turn_then_to_its_numbers_in_turn():
    a, b = uuid.uuid4(), uuid.uuid4()
    a1, a2, a3, b1 = (uuid.uuid4() for _ in range(4))
    # project A has three busy numbers, project B one: B gets as many slots as A, A's spread over its numbers
    quotas = share(8, [(a, a1, 100), (a, a2, 100), (a, a3, 100), (b, b1, 100)])
    assert quotas[(b, b1)] == 4
    assert sorted(quotas[(a, n)] for n in (a1, a2, a3)) == [1, 1, 2]
    # a number never gets more than it has queued; what it cannot take goes to the others
    assert share(5, [(a, a1, 1), (b, b1, 10)]) == {(a, a1): 1, (b, b1): 4}
    assert share(3, [(a, a1, 0)]) == {}
