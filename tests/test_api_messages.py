"""Messages over the REST API: ``GET /v1/messages`` with each filter and its cursor, ``GET
/v1/messages/{id}`` with the status history the send lane's reports write, what sent each message (a
sequence's step, a one-off, a rule at once or delayed, the contact), another project's messages, bad
filters, and the index each filter's query walks."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from litestar.testing import TestClient
from psycopg_pool import ConnectionPool

from libs.common.core.runtime import Runtime
from libs.common.platform.messages import QUERIES
from tests.conftest import Project, sign_in
from tests.delayed_rule_helpers import customer_writes, fire, new_conversation, send, set_time, the_one
from tests.rule_helpers import create_rule, post_event, process
from tests.test_api_sequences import assert_problem, enroll, message_step, new_contact, published, release
from tests.test_query_plans import explain, index_names, seq_scanned

# --- helpers


def listed(client: TestClient[Any], **params: Any) -> list[dict[str, Any]]:
    response = client.get("/v1/messages", params=params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def ids(client: TestClient[Any], **params: Any) -> list[str]:
    return [m["id"] for m in listed(client, **params)]


def followup_message(client: TestClient[Any], runtime: Runtime, text: str = "Hello") -> dict[str, Any]:
    """A published one-step sequence's message for a new contact, released; the message as listed."""
    sequence_id = published(client, message_step(text))
    enrollment = enroll(client, sequence_id, new_contact(client))
    release(runtime)
    [message] = listed(client, enrollment_id=enrollment["id"])
    return message


def report(client: TestClient[Any], message_id: str, status: str, **fields: Any) -> dict[str, Any]:
    return post_event(
        client, {"type": "message.status", "message_id": message_id, "status": status, **fields}
    )


def advance(runtime: Runtime, seconds: float = 1) -> None:
    runtime.clock.advance(timedelta(seconds=seconds))  # type: ignore[attr-defined]


# --- what sent a message


def test_a_follow_up_names_its_sequence_version_and_step(client: TestClient[Any], runtime: Runtime) -> None:
    sequence_id = published(client, message_step("first"), message_step("second", delay_seconds=60))
    # a second version: the enrollment made now is pinned to it
    client.patch(
        f"/v1/sequences/{sequence_id}",
        json={"definition": {"steps": [message_step("one"), message_step("two", delay_seconds=60)]}},
    )
    assert client.post(f"/v1/sequences/{sequence_id}/publish").status_code == 201
    contact_id = new_contact(client)
    enrollment = enroll(client, sequence_id, contact_id)
    release(runtime)
    advance(runtime, 61)
    release(runtime)

    messages = listed(client, enrollment_id=enrollment["id"])
    assert [m["body"] for m in messages] == ["two", "one"]  # newest first
    for index, message in zip((1, 0), messages, strict=True):
        assert message["source"] == "followup" and message["direction"] == "outbound"
        assert message["contact_id"] == contact_id
        assert message["origin"] == {
            "kind": "sequence",
            "enrollment_id": enrollment["id"],
            "sequence_id": sequence_id,
            "sequence_version": 2,
            "step_index": index,
            "rule_id": None,
            "rule_execution_id": None,
            "campaign_id": None,
        }
    assert ids(client, sequence_id=sequence_id) == [m["id"] for m in messages]


def test_a_campaigns_follow_up_names_its_campaign(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    sequence_id = published(client, message_step("Still thinking it over?"))
    campaign_id = str(uuid.uuid4())
    response = client.put(f"/v1/campaigns/{campaign_id}", json={"sequence_id": sequence_id, "name": "Spring"})
    assert response.status_code == 200, response.text
    contact_id = new_contact(client)
    released = post_event(
        client,
        {
            "type": "campaign.recipient_released",
            "campaign_id": campaign_id,
            "recipient_id": "r-1",
            "contact_id": contact_id,
        },
    )
    # the same sequence enrolled from the API: its message is the sequence's, no campaign's
    enroll(client, sequence_id, new_contact(client))
    release(runtime)

    [message] = listed(client, campaign_id=campaign_id)
    assert message["contact_id"] == contact_id and message["source"] == "followup"
    assert message["origin"] == {
        "kind": "sequence",
        "enrollment_id": released["enrollment_id"],
        "sequence_id": sequence_id,
        "sequence_version": 1,
        "step_index": 0,
        "rule_id": None,
        "rule_execution_id": None,
        "campaign_id": campaign_id,
    }
    read = client.get(f"/v1/messages/{message['id']}").json()
    assert read["origin"] == message["origin"]
    by_sequence = listed(client, sequence_id=sequence_id)
    assert len(by_sequence) == 2
    assert [m["origin"]["campaign_id"] for m in by_sequence if m["id"] != message["id"]] == [None]
    assert ids(client, campaign_id=str(uuid.uuid4())) == []
    # the contact card says which campaign sent it
    sign_in(client, project)
    card = client.get(f"/app/contacts/{contact_id}").text
    assert "version 1, step 1, campaign Spring" in card


def test_a_one_off_follow_up_names_its_enrollment_and_no_sequence(
    client: TestClient[Any], runtime: Runtime
) -> None:
    contact_id = new_contact(client)
    conversation_id = new_conversation(client, contact_id)
    response = client.post(
        f"/v1/conversations/{conversation_id}/follow-up", json={"text": "still there?", "delay_seconds": 0}
    )
    assert response.status_code == 201, response.text
    release(runtime)
    [message] = listed(client, conversation_id=conversation_id)
    assert message["body"] == "still there?"
    assert message["origin"]["kind"] == "one_off"
    assert message["origin"]["enrollment_id"] == response.json()["id"]
    assert (message["origin"]["sequence_id"], message["origin"]["sequence_version"]) == (None, None)


def test_a_rule_run_at_once_names_the_rule(client: TestClient[Any], runtime: Runtime) -> None:
    rule_id = create_rule(client, "conversation.created", [send("welcome aboard")])
    conversation_id = new_conversation(client)
    process(runtime)
    [message] = listed(client, rule_id=rule_id)
    assert (message["body"], message["source"], message["conversation_id"]) == (
        "welcome aboard",
        "rule",
        conversation_id,
    )
    assert message["origin"] | {"rule_id": None} == {
        "kind": "rule",
        "enrollment_id": None,
        "sequence_id": None,
        "sequence_version": None,
        "step_index": None,
        "rule_id": None,
        "rule_execution_id": None,
        "campaign_id": None,
    }
    assert message["origin"]["rule_id"] == rule_id


def test_a_delayed_rule_names_its_execution(client: TestClient[Any], runtime: Runtime) -> None:
    set_time(runtime, "2030-01-07T09:00")
    rule_id = create_rule(client, "conversation.created", [send("an hour later")], execution_delay_minutes=60)
    new_conversation(client)
    process(runtime)
    set_time(runtime, "2030-01-07T10:00")
    fire(runtime)
    execution = the_one(client, rule_id)
    [message] = listed(client, rule_id=rule_id)
    assert execution["message_id"] == message["id"]
    assert (message["origin"]["rule_id"], message["origin"]["rule_execution_id"]) == (
        rule_id,
        execution["id"],
    )


def test_a_contacts_message_is_inbound_from_the_contact(client: TestClient[Any]) -> None:
    contact_id = new_contact(client)
    conversation_id = customer_writes(client, contact_id)
    [message] = listed(client, contact_id=contact_id)
    assert (message["direction"], message["status"], message["source"], message["origin"]["kind"]) == (
        "inbound",
        "RECEIVED",
        "contact",
        "contact",
    )
    assert message["conversation_id"] == conversation_id


def test_a_conversation_reads_with_its_last_messages(client: TestClient[Any], runtime: Runtime) -> None:
    contact_id = new_contact(client)
    conversation_id = customer_writes(client, contact_id)
    for index in range(25):
        advance(runtime)
        post_event(
            client,
            {
                "type": "message.inbound",
                "contact_id": contact_id,
                "conversation_id": conversation_id,
                "provider_message_id": f"c{index}",
            },
        )
    read = client.get(f"/v1/conversations/{conversation_id}").json()
    assert read["id"] == conversation_id
    assert [m["id"] for m in read["last_messages"]] == ids(client, conversation_id=conversation_id, limit=20)
    assert len(read["last_messages"]) == 20


# --- status history


def test_the_status_history_follows_the_send_lanes_reports(client: TestClient[Any], runtime: Runtime) -> None:
    message = followup_message(client, runtime)
    assert client.get(f"/v1/messages/{message['id']}").json()["status_history"][0]["status"] == "QUEUED"

    advance(runtime)
    claimed = client.post("/v1/send-lane/claim", json={"limit": 10}).json()["items"]
    assert [m["id"] for m in claimed] == [message["id"]]
    for status in ("SENT", "DELIVERED", "READ"):
        advance(runtime)
        answer = report(client, message["id"], status, provider_message_id="wamid.1")
        # the answer names the message's contact and conversation
        assert (answer["contact_id"], answer["conversation_id"]) == (
            message["contact_id"],
            message["conversation_id"],
        )
    # a report going backwards changes nothing
    report(client, message["id"], "SENT")

    detail = client.get(f"/v1/messages/{message['id']}").json()
    assert detail["status"] == "READ" and detail["provider_message_id"] == "wamid.1"
    history = detail["status_history"]
    assert [h["status"] for h in history] == ["QUEUED", "PROCESSING", "SENT", "DELIVERED", "READ"]
    times = [h["occurred_at"] for h in history]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert listed(client, status="READ") == [{k: v for k, v in detail.items() if k != "status_history"}]


def test_a_failure_is_in_the_history_with_its_error(client: TestClient[Any], runtime: Runtime) -> None:
    message = followup_message(client, runtime)
    client.post("/v1/send-lane/claim", json={"limit": 10})
    report(client, message["id"], "FAILED", error="131026 undeliverable")
    detail = client.get(f"/v1/messages/{message['id']}").json()
    assert (detail["status"], detail["error"]) == ("FAILED", "131026 undeliverable")
    assert detail["status_history"][-1] | {"occurred_at": None} == {
        "status": "FAILED",
        "detail": "131026 undeliverable",
        "action": None,
        "occurred_at": None,
    }


def test_a_cancelled_follow_up_says_why(client: TestClient[Any], runtime: Runtime) -> None:
    sequence_id = published(client, message_step("soon"))
    contact_id = new_contact(client)
    enrollment = enroll(client, sequence_id, contact_id)
    release(runtime)
    customer_writes(client, contact_id)  # the reply cancels the queued follow-up
    [message] = listed(client, enrollment_id=enrollment["id"])
    detail = client.get(f"/v1/messages/{message['id']}").json()
    assert detail["status"] == "CANCELLED"
    assert [(h["status"], h["detail"]) for h in detail["status_history"]] == [
        ("QUEUED", None),
        ("CANCELLED", "replied"),
    ]


# --- filters and paging


def test_each_filter_narrows_the_list(client: TestClient[Any], runtime: Runtime) -> None:
    first = followup_message(client, runtime, "a")
    advance(runtime, 10)
    second = followup_message(client, runtime, "b")
    advance(runtime, 10)
    inbound_conversation = customer_writes(client, second["contact_id"])
    everything = ids(client)
    assert len(everything) == 3 and everything[1:] == [second["id"], first["id"]]
    inbound = everything[0]

    assert ids(client, contact_id=first["contact_id"]) == [first["id"]]
    assert ids(client, contact_id=second["contact_id"]) == [inbound, second["id"]]
    assert ids(client, conversation_id=first["conversation_id"]) == [first["id"]]
    assert inbound in ids(client, conversation_id=inbound_conversation)
    assert ids(client, enrollment_id=first["origin"]["enrollment_id"]) == [first["id"]]
    assert ids(client, sequence_id=second["origin"]["sequence_id"]) == [second["id"]]
    assert ids(client, source="contact") == [inbound]
    assert ids(client, source="followup") == [second["id"], first["id"]]
    assert ids(client, source="rule") == []
    # the reply cancelled the second contact's queued follow-up
    assert ids(client, status="QUEUED") == [first["id"]]
    assert ids(client, status="CANCELLED") == [second["id"]]
    assert ids(client, status="RECEIVED") == [inbound]
    assert ids(client, rule_id=str(uuid.uuid4())) == []
    # the time range: created_after inclusive, created_before exclusive
    at = second["created_at"]
    assert ids(client, created_after=at) == [inbound, second["id"]]
    assert ids(client, created_before=at) == [first["id"]]
    assert ids(client, created_after=first["created_at"], created_before=at) == [first["id"]]
    # filters combine
    assert ids(client, contact_id=second["contact_id"], source="followup", status="CANCELLED") == [
        second["id"]
    ]
    assert ids(client, contact_id=first["contact_id"], status="RECEIVED") == []


def test_pages_follow_the_cursor_newest_first(client: TestClient[Any], runtime: Runtime) -> None:
    contact_id = new_contact(client)
    written = []
    for index in range(5):
        advance(runtime)
        written.append(
            post_event(
                client,
                {"type": "message.inbound", "contact_id": contact_id, "provider_message_id": f"p{index}"},
            )["message_id"]
        )
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, "contact_id": contact_id}
        if after is not None:
            params["after"] = after
        body = client.get("/v1/messages", params=params).json()
        seen += [m["id"] for m in body["items"]]
        pages += 1
        after = body["next"]
        if after is None:
            break
    assert seen == written[::-1] and pages == 3


def test_another_projects_message_is_a_404_like_a_random_id(
    client: TestClient[Any], runtime: Runtime, other_project: Project
) -> None:
    message = followup_message(client, runtime)
    theirs = client.get(f"/v1/messages/{message['id']}", headers=other_project.headers)
    unknown = client.get(f"/v1/messages/{uuid.uuid4()}", headers=other_project.headers)
    assert_problem(theirs, 404, "message_id")
    assert theirs.json() == unknown.json()
    other_list = client.get("/v1/messages", headers=other_project.headers).json()
    assert other_list == {"items": [], "next": None}
    filtered = client.get(
        "/v1/messages", params={"contact_id": message["contact_id"]}, headers=other_project.headers
    ).json()
    assert filtered["items"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"contact_id": "nope"}, "contact_id"),
        ({"conversation_id": "1"}, "conversation_id"),
        ({"enrollment_id": "x"}, "enrollment_id"),
        ({"rule_id": "x"}, "rule_id"),
        ({"sequence_id": "x"}, "sequence_id"),
        ({"campaign_id": "x"}, "campaign_id"),
        ({"source": "robot"}, "source"),
        ({"status": "BOUNCED"}, "status"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"created_before": "2030-13-01T00:00:00Z"}, "created_before"),
        ({"created_after": "2030-01-01T00:00:00"}, "created_after"),
        # a number is not read as seconds since 1970, as a body's time is not
        ({"created_before": "12345"}, "created_before"),
        ({"created_after": "1.5"}, "created_after"),
        (
            {"created_after": "2030-01-02T00:00:00Z", "created_before": "2030-01-01T00:00:00Z"},
            "created_before",
        ),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"after": "x"}, "after"),
    ],
)
def test_a_bad_filter_is_a_4xx_naming_it(client: TestClient[Any], params: dict[str, str], field: str) -> None:
    response = client.get("/v1/messages", params=params)
    assert 400 <= response.status_code < 500, response.text
    assert_problem(response, response.status_code, field)


def test_reading_messages_needs_only_the_read_scope(client: TestClient[Any], project: Project) -> None:
    response = client.post("/v1/api-keys", json={"name": "reader", "scope": "read"})
    assert response.status_code == 201, response.text
    headers = {"Authorization": f"Bearer {response.json()['api_key']}"}
    assert client.get("/v1/messages", headers=headers).status_code == 200
    assert client.get(f"/v1/messages/{uuid.uuid4()}", headers=headers).status_code == 404


# --- plans

#: Messages of other contacts and projects, enough that a scan of the table is clearly the worse plan.
OTHER_MESSAGES = 5000


def test_every_filter_walks_an_index_leading_with_the_project(pool: ConnectionPool, project: Project) -> None:
    other = uuid.uuid4()
    contact, conversation, enrollment, rule, sequence, campaign = (uuid.uuid4() for _ in range(6))
    with pool.connection() as conn:
        conn.execute("SET LOCAL session_replication_role = replica")  # the seed rows have no parents
        conn.execute(
            """INSERT INTO messages (project_id, contact_id, conversation_id, direction, status, source,
                                     followup_enrollment_id, sequence_id, rule_id, campaign_id, created_at)
               SELECT CASE WHEN i %% 2 = 0 THEN %s ELSE %s END, gen_random_uuid(), gen_random_uuid(),
                      'outbound', 'SENT', CASE WHEN i %% 3 = 0 THEN 'rule' ELSE 'followup' END,
                      gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
                      '2030-01-01'::timestamptz + i * interval '1 minute'
               FROM generate_series(1, %s) i""",
            (project.id, other, OTHER_MESSAGES),
        )
        conn.execute("ANALYZE messages")
        base = {
            "project_id": project.id,
            "limit": 51,
            "after": None,
            "id": None,
            **dict.fromkeys(
                (
                    "contact_id",
                    "conversation_id",
                    "enrollment_id",
                    "rule_id",
                    "sequence_id",
                    "campaign_id",
                    "source",
                    "status",
                    "created_after",
                    "created_before",
                )
            ),
        }
        cases = {
            "contact_id": (contact, "messages_project_contact_idx"),
            "conversation_id": (conversation, "messages_project_conversation_idx"),
            "enrollment_id": (enrollment, "messages_project_enrollment_idx"),
            "rule_id": (rule, "messages_project_rule_idx"),
            "sequence_id": (sequence, "messages_project_sequence_idx"),
            "campaign_id": (campaign, "messages_project_campaign_idx"),
            "source": ("rule", "messages_project_created_idx"),
            "status": ("SENT", "messages_project_created_idx"),
            "created_after": ("2030-01-02T00:00:00Z", "messages_project_created_idx"),
            None: (None, "messages_project_created_idx"),
            "id": (uuid.uuid4(), "messages_pkey"),
        }
        for name, (value, index) in cases.items():
            params = base | ({name: value} if name else {})
            nodes = explain(conn, QUERIES["list_messages"], params)
            assert index in index_names(nodes), (name, index_names(nodes))
            assert "messages" not in seq_scanned(nodes), name
        conn.rollback()


# --- the enrollment's conversation


@pytest.mark.parametrize("steps", [1, 2])
def test_an_enrollment_takes_the_conversation_its_message_went_to(
    client: TestClient[Any], runtime: Runtime, steps: int
) -> None:
    # enrolled with no conversation: its first message opens one, and the enrollment names it from then on
    # (a one-step sequence completes with that message; a longer one advances)
    sequence_id = published(client, *(message_step(f"step {i}", delay_seconds=60 * i) for i in range(steps)))
    enrollment = enroll(client, sequence_id, new_contact(client))
    assert enrollment["conversation_id"] is None
    release(runtime)
    [message] = listed(client, enrollment_id=enrollment["id"])
    read = client.get(f"/v1/enrollments/{enrollment['id']}").json()["enrollment"]
    assert message["conversation_id"] is not None
    assert read["conversation_id"] == message["conversation_id"]
    assert read["status"] == ("completed" if steps == 1 else "active")
