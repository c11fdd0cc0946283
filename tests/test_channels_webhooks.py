"""The providers' webhooks through the API: Meta's verification, signatures checked before anything is
written, replies, statuses and opt-outs become the platform events, idempotently; and a number's channel
set through the API, its credentials never shown again."""

from __future__ import annotations

import logging
import uuid

import pytest

from followups.fake_providers import fake_graph, fake_twilio
from libs.common.channels.setup import webhook_path
from tests.channel_helpers import (
    APP_SECRET,
    AUTH_TOKEN,
    VERIFY_TOKEN,
    drain,
    queue,
    send_lane,
    send_state,
    status,
    through,
    twilio_number,
    whatsapp_number,
    with_providers,
)
from tests.conftest import client_of
from tests.factories import make_contact, new_phone
from tests.helpers import rows


@pytest.fixture
def graph():
    with fake_graph(app_secret=APP_SECRET) as fake:
        yield fake


@pytest.fixture
def twilio():
    with fake_twilio(auth_token=AUTH_TOKEN) as fake:
        yield fake


@pytest.fixture
def wired(api_app, runtime, graph, twilio):
    """The runtime on the fakes and an API client over it; the fakes' webhooks go through the client."""
    runtime = with_providers(runtime, graph, twilio)
    with client_of(api_app, runtime) as client:
        graph.poster = twilio.poster = through(client)
        yield runtime, client


def inbound(pool, project_id):
    return rows(
        pool,
        "SELECT provider_message_id, body, c.phone FROM messages m JOIN contacts c ON c.id = m.contact_id"
        " WHERE m.project_id = %s AND direction = 'inbound' ORDER BY m.created_at",
        project_id,
    )


def test_meta_verifies_the_webhook_with_the_numbers_verify_token(pool, project, graph, wired):
    runtime, client = wired
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    path = webhook_path("whatsapp_cloud", number_id)
    query = {"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1158201444"}

    answer = client.get(path, params=query)
    assert answer.status_code == 200 and answer.text == "1158201444"
    refused = client.get(path, params=query | {"hub.verify_token": "not-the-token"})
    assert refused.status_code == 403
    assert client.get(webhook_path("whatsapp_cloud", uuid.uuid4()), params=query).status_code == 404


def test_a_reply_is_recorded_once_and_a_bad_signature_writes_nothing(pool, project, graph, wired):
    runtime, client = wired
    number_id, phone_number_id = whatsapp_number(pool, runtime, project.id, graph)
    url = webhook_path("whatsapp_cloud", number_id)

    # Given a webhook signed with another secret, or not signed at all
    forged = graph.webhook(
        url, {"messages": []}, phone_number_id=phone_number_id, secret="not-the-app-secret"
    )
    assert forged.status_code == 401
    unsigned = client.post(url, content=b'{"entry": []}', headers={"Content-Type": "application/json"})
    assert unsigned.status_code == 401
    body_phone = new_phone()
    refused = graph.webhook(
        url,
        {"messages": [{"from": body_phone[1:], "id": "wamid.X1", "type": "text", "text": {"body": "hi"}}]},
        phone_number_id=phone_number_id,
        secret="not-the-app-secret",
    )
    assert refused.status_code == 401
    assert inbound(pool, project.id) == []

    # When Meta delivers the reply, then delivers it again
    first = graph.reply(url, phone_number_id, body_phone, "Yes, send it", message_id="wamid.X1")
    again = graph.reply(url, phone_number_id, body_phone, "Yes, send it", message_id="wamid.X1")

    # Then it is recorded once, for a contact made from its phone
    assert first.status_code == 200 and first.json() == {"applied": 1, "repeated": 0, "ignored": 0}
    assert again.json() == {"applied": 0, "repeated": 1, "ignored": 0}
    assert inbound(pool, project.id) == [("wamid.X1", "Yes, send it", body_phone)]


def test_another_numbers_changes_are_ignored(pool, project, graph, wired):
    runtime, _ = wired
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    answer = graph.reply(webhook_path("whatsapp_cloud", number_id), "999999", new_phone(), "hello")
    assert answer.status_code == 200 and answer.json()["applied"] == 0
    assert inbound(pool, project.id) == []


def test_statuses_move_the_message_forward_and_a_failure_keeps_its_code(pool, project, graph, wired):
    runtime, client = wired
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    contact_id = make_contact(pool, project.id)
    delivered_id = queue(pool, runtime, project.id, contact_id, number_id, "one")
    failed_id = queue(pool, runtime, project.id, contact_id, number_id, "two")
    with send_lane(runtime) as lane:
        assert drain(lane) == 2
    taken = {t.request["biz_opaque_callback_data"]: t for t in graph.taken}
    url = webhook_path("whatsapp_cloud", number_id)

    graph.status(url, taken[str(delivered_id)], "delivered")
    graph.status(url, taken[str(delivered_id)], "read")
    late = graph.status(url, taken[str(delivered_id)], "delivered")  # out of order: changes nothing
    graph.status(url, taken[str(failed_id)], "failed", code=131047, title="Re-engagement message")

    assert late.json() == {"applied": 0, "repeated": 1, "ignored": 0}
    assert status(pool, delivered_id) == ("READ", taken[str(delivered_id)].id, None)
    assert status(pool, failed_id) == ("FAILED", taken[str(failed_id)].id, "131047")
    shown = client.get(f"/v1/messages/{failed_id}", headers=project.headers).json()
    assert (shown["error_code"], shown["error"]) == ("131047", "Re-engagement message")


def test_a_status_reconciles_a_send_whose_answer_was_lost(pool, project, graph, wired):
    runtime, _ = wired
    number_id, _ = whatsapp_number(pool, runtime, project.id, graph)
    message_id = queue(pool, runtime, project.id, make_contact(pool, project.id), number_id)
    graph.mode = "drop"  # the provider takes it, the answer never comes back
    with send_lane(runtime) as lane:
        assert drain(lane) == 1
    assert send_state(pool, message_id)[0] == "unconfirmed"

    [taken] = graph.taken
    graph.status(webhook_path("whatsapp_cloud", number_id), taken, "sent")

    assert status(pool, message_id) == ("SENT", taken.id, None)
    assert send_state(pool, message_id) is None


def test_an_opt_out_keyword_opts_the_contact_out(pool, project, graph, wired):
    runtime, _ = wired
    number_id, phone_number_id = whatsapp_number(pool, runtime, project.id, graph)
    phone = new_phone()
    graph.reply(webhook_path("whatsapp_cloud", number_id), phone_number_id, phone, " stop! ")
    [(opted_out,)] = rows(
        pool,
        "SELECT opted_out_at IS NOT NULL FROM contacts WHERE project_id = %s AND phone = %s",
        project.id,
        phone,
    )
    assert opted_out is True


def test_twilio_replies_statuses_and_opt_outs_with_its_signature(pool, project, twilio, wired):
    runtime, _client = wired
    number_id = twilio_number(pool, runtime, project.id, twilio)
    url = "https://followups.example.com" + webhook_path("twilio", number_id)
    phone = new_phone()

    forged = twilio.webhook(
        url, {"MessageSid": "SM1", "Body": "hi", "From": f"whatsapp:{phone}"}, auth_token="wrong-token"
    )
    assert forged.status_code == 401
    assert inbound(pool, project.id) == []

    answer = twilio.reply(url, phone, "whatsapp:+15550000000", "Sounds good", sid="SM" + "a" * 32)
    assert answer.status_code == 200 and "<Response>" in answer.text
    assert inbound(pool, project.id) == [("SM" + "a" * 32, "Sounds good", phone)]

    message_id = queue(pool, runtime, project.id, make_contact(pool, project.id), number_id)
    with send_lane(runtime) as lane:
        assert drain(lane) == 1
    [taken] = twilio.taken
    assert twilio.status(taken, "sent").status_code == 200
    assert twilio.status(taken, "undelivered", error_code="63016").status_code == 200
    assert status(pool, message_id) == ("FAILED", taken.id, "63016")

    stop = twilio.webhook(
        url,
        {"MessageSid": "SM" + "b" * 32, "Body": "Arrêter", "From": f"whatsapp:{phone}", "OptOutType": "STOP"},
    )
    assert stop.status_code == 200
    [(opted_out,)] = rows(
        pool,
        "SELECT opted_out_at IS NOT NULL FROM contacts WHERE project_id = %s AND phone = %s",
        project.id,
        phone,
    )
    assert opted_out is True


def test_a_numbers_credentials_are_write_only(pool, project, wired, caplog):
    _runtime, client = wired
    client.headers.update(project.headers)
    number = client.post("/v1/numbers", json={"phone": new_phone()}).json()
    secrets = {
        "access_token": "EAAG-secret-token-1",
        "app_secret": "app-secret-2",
        "verify_token": "verify-3",
    }
    body = {"provider": "whatsapp_cloud", "phone_number_id": "106540352242922", **secrets}

    with caplog.at_level(logging.DEBUG):
        put = client.put(f"/v1/numbers/{number['id']}/channel", json=body)
        got = client.get(f"/v1/numbers/{number['id']}/channel")

    assert put.status_code == 200 and got.status_code == 200
    for answer in (put, got):
        assert not any(secret in answer.text for secret in secrets.values())
    assert got.json()["credentials_set"] == ["access_token", "app_secret", "verify_token"]
    assert got.json()["webhook_path"] == f"/v1/providers/whatsapp/{number['id']}/webhook"
    assert not any(secret in caplog.text for secret in secrets.values())

    bad = client.put(f"/v1/numbers/{number['id']}/channel", json=body | {"phone_number_id": "not digits"})
    assert bad.status_code in (400, 422) and "phone_number_id" in bad.text
    assert client.put(f"/v1/numbers/{uuid.uuid4()}/channel", json=body).status_code == 404
    assert client.delete(f"/v1/numbers/{number['id']}/channel").status_code in (200, 204)
    assert client.get(f"/v1/numbers/{number['id']}/channel").status_code == 404
