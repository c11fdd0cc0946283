"""The thin slice that crosses every boundary.

API (enroll) -> PostgreSQL -> release worker in a separate process (claim, queue, step run, outbox)
-> outbox relay -> RabbitMQ topic exchange -> a consumer bound to it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from litestar.testing import TestClient

from libs.common.core.broker import create_broker
from libs.common.core.clock import SYSTEM_CLOCK
from libs.common.core.runtime import Runtime
from libs.common.core.settings import BrokerSettings, Settings
from services.api.app import create_app
from tests.conftest import SHARED_QUEUE_TYPE, Project
from tests.helpers import EventsConsumer, start_worker

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def exchange() -> str:
    return f"followups.events.test.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def consumer(amqp_url: str, exchange: str) -> Iterator[EventsConsumer]:
    consumer = EventsConsumer(amqp_url, exchange, ("followup.#", "message.#"))
    yield consumer
    consumer.close()


@pytest.fixture
def api(settings: Settings, pool: Any, amqp_url: str, project: Project) -> Iterator[TestClient[Any]]:
    """The API on the wall clock, nudging release workers over RabbitMQ."""
    broker = create_broker(BrokerSettings(amqp_url=amqp_url, queue_type=SHARED_QUEUE_TYPE))
    runtime = Runtime(settings, pool, broker, SYSTEM_CLOCK)
    with TestClient(app=create_app(runtime)) as client:
        client.headers.update(project.headers)
        yield client
    broker.close()


def test_enrollment_is_released_by_a_worker_process_and_its_event_reaches_rabbitmq(
    api: TestClient[Any], db_url: str, amqp_url: str, exchange: str, consumer: EventsConsumer
) -> None:
    # Given a contact and a published one-step sequence
    contact = api.post("/v1/contacts", json={"phone": "+14155550100", "name": "Ada"}).json()
    sequence = api.post(
        "/v1/sequences",
        json={"name": "welcome", "definition": {"steps": [{"kind": "message", "text": "Hello Ada"}]}},
    ).json()
    assert api.post(f"/v1/sequences/{sequence['id']}/publish").status_code == 201
    worker = start_worker(
        "release", {"DATABASE_URL": db_url, "AMQP_URL": amqp_url, "EVENTS_EXCHANGE": exchange}
    )
    try:
        # When the contact is enrolled through the API
        response = api.post(
            "/v1/enrollments", json={"sequence_id": sequence["id"], "contact_id": contact["id"]}
        )
        assert response.status_code == 201, response.text
        enrollment_id = response.json()["id"]

        # Then the worker queues the message and the relay publishes followup.step_queued
        event = consumer.wait_for(
            lambda key, env: key == "followup.step_queued" and env["data"]["enrollment_id"] == enrollment_id
        )
    finally:
        code = worker.stop()
    assert code == 0, worker.output
    assert event["type"] == "followup.step_queued"
    assert event["source"] == "followups"
    assert event["subject"] == f"followup_enrollment/{enrollment_id}"
    assert event["data"]["step_index"] == 0
    message_id = event["data"]["message_id"]
    with psycopg.connect(db_url) as conn:
        message = conn.execute(
            "SELECT status, source, priority, body, followup_enrollment_id::text FROM messages WHERE id = %s",
            (message_id,),
        ).fetchone()
        runs = conn.execute(
            "SELECT step_index, outcome, message_id::text FROM followup_step_runs WHERE enrollment_id = %s",
            (enrollment_id,),
        ).fetchall()
        status = conn.execute(
            "SELECT status FROM followup_enrollments WHERE id = %s", (enrollment_id,)
        ).fetchone()
        unpublished = conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL").fetchone()
    assert message == ("QUEUED", "followup", 5, "Hello Ada", enrollment_id)
    assert runs == [(0, "queued", message_id)]
    assert status == ("completed",)
    # message.queued, followup.step_queued and followup.completed were all relayed, in that order
    keys = [key for key, env in consumer.received]
    consumer.wait_for(lambda key, env: key == "followup.completed", timeout=10)
    keys = [key for key, env in consumer.received]
    assert (
        keys.index("message.queued") < keys.index("followup.step_queued") < keys.index("followup.completed")
    )
    assert unpublished is not None
