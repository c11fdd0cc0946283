"""A typed client generated from the served OpenAPI document (``openapi-python-client``, as a user would)
runs the first workflow: a contact, a sequence whose steps are read back typed, publish, enroll, a reply
that stops the enrollment, a rule with a delay, a 422 problem body. So the document is one a generator can
use: definitions typed as the definition, statuses as enums, one cursor type, every name a class name.

The client is generated (~10 s) into the test's temporary folder and imported from there; its requests go
through the API's test client (the generated client takes any ``httpx.Client``).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.conftest import Project

#: The generated package's name (unique, so it shadows nothing on ``sys.path``).
PACKAGE = "followups_generated_client"


@pytest.fixture
def generated(client: TestClient[Any], tmp_path: Path) -> Iterator[ModuleType]:
    """The client generated from ``/schema/openapi.json``, imported; no warning from the generator."""
    folder = tmp_path
    document = folder / "openapi.json"
    served = client.get("/schema/openapi.json")
    assert served.status_code == 200, served.text
    document.write_text(json.dumps(served.json()))
    run = subprocess.run(
        [
            *(sys.executable, "-m", "openapi_python_client", "generate"),
            *("--path", str(document), "--meta", "none", "--output-path", str(folder / PACKAGE)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Warning" not in run.stdout, run.stdout  # a schema it could not use is left out, with a warning
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(folder))
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
            del sys.modules[name]


@pytest.fixture
def typed(generated: ModuleType, client: TestClient[Any], project: Project) -> Any:
    """The generated client, authenticated as ``project``, over the API's test client."""
    return generated.AuthenticatedClient(
        base_url=str(client.base_url), token=project.api_key
    ).set_httpx_client(client)


def test_the_first_workflow_through_a_generated_client(generated: ModuleType, typed: Any) -> None:
    m = importlib.import_module(f"{PACKAGE}.models")
    # a contact
    created = importlib.import_module(f"{PACKAGE}.api.contacts.v1_contacts_create").sync_detailed(
        client=typed, body=m.ContactCreate(phone="+14155550123", name="Ada")
    )
    assert created.status_code == 201, created.content
    contact = created.parsed
    assert isinstance(contact, m.Contact) and isinstance(contact.id, uuid.UUID)
    # a page's cursor is the type every `after` takes
    listed = importlib.import_module(f"{PACKAGE}.api.contacts.v1_contacts_list")
    importlib.import_module(f"{PACKAGE}.api.contacts.v1_contacts_create").sync(
        client=typed, body=m.ContactCreate(phone="+14155550124")
    )
    first = listed.sync(client=typed, limit=1)
    assert isinstance(first, m.ContactPage) and isinstance(first.next_, uuid.UUID)
    second = listed.sync(client=typed, limit=1, after=first.next_)
    assert second.next_ is None and second.items[0].id != first.items[0].id

    # a sequence, its steps read back typed
    steps = [
        m.MessageStep(kind=m.MessageStepKind.MESSAGE, text="Hi {{contact.name}}!"),
        m.MessageStep(
            kind=m.MessageStepKind.MESSAGE,
            text="Still there?",
            delay_seconds=3600,
            only_if=[m.MessageStepOnlyIfItem.NO_REPLY_SINCE_PREVIOUS_STEP],
        ),
    ]
    sequence = importlib.import_module(f"{PACKAGE}.api.sequences.v1_sequences_create").sync(
        client=typed, body=m.SequenceCreate(name="Welcome", definition=m.Definition(steps=steps))
    )
    assert isinstance(sequence, m.Sequence) and sequence.status == m.SequenceStatus.DRAFT
    assert isinstance(sequence.draft, m.Definition)
    read_back = sequence.draft.steps[1]
    assert isinstance(read_back, m.MessageStep)
    assert (read_back.text, read_back.delay_seconds) == ("Still there?", 3600)
    assert read_back.only_if == [m.MessageStepOnlyIfItem.NO_REPLY_SINCE_PREVIOUS_STEP]

    # publish
    published = importlib.import_module(
        f"{PACKAGE}.api.sequences.v1_sequences_sequence_id_publish_publish"
    ).sync_detailed(client=typed, sequence_id=sequence.id)
    assert published.status_code == 201, published.content
    version = published.parsed
    assert isinstance(version, m.Published) and version.version == 1
    assert [step.text for step in version.definition.steps] == ["Hi {{contact.name}}!", "Still there?"]
    # the warnings typed too: {{contact.name}} without a fallback would skip the step for a nameless contact
    assert [(w.field, w.placeholder, w.skip_reason) for w in version.warnings] == [
        ("definition.steps.0.text", "contact.name", m.DefinitionWarningSkipReason.MISSING_VARIABLE)
    ]

    # enroll
    enrollment = importlib.import_module(f"{PACKAGE}.api.enrollments.v1_enrollments_enroll").sync(
        client=typed, body=m.EnrollRequest(contact_id=contact.id, sequence_id=sequence.id)
    )
    assert isinstance(enrollment, m.Enrollment) and enrollment.status == m.EnrollmentStatus.ACTIVE

    # a reply stops it
    event = importlib.import_module(f"{PACKAGE}.api.platform_events.v1_events_apply").sync(
        client=typed,
        body=m.InboundMessage(
            type_=m.InboundMessageType.MESSAGE_INBOUND,
            contact_id=contact.id,
            provider_message_id="wamid.first-reply",
            body="Thanks!",
        ),
    )
    assert isinstance(event, m.EventResult), event
    detail = importlib.import_module(f"{PACKAGE}.api.enrollments.v1_enrollments_enrollment_id_read").sync(
        client=typed, enrollment_id=enrollment.id
    )
    assert isinstance(detail, m.EnrollmentDetail)
    stopped = detail.enrollment
    assert stopped.status == m.EnrollmentStatus.STOPPED and stopped.reason == "replied"

    # a rule with a delay
    rule = importlib.import_module(f"{PACKAGE}.api.rules.v1_rules_create").sync(
        client=typed,
        body=m.RuleCreate(
            name="Tagged, later",
            event=m.RuleCreateEvent.CONTACT_TAG_ADDED,
            actions=[m.AddContactTag(type_=m.AddContactTagType.ADD_CONTACT_TAG, tags=["followed-up"])],
            execution_delay_minutes=30,
        ),
    )
    assert isinstance(rule, m.Rule) and rule.execution_delay_minutes == 30
    assert isinstance(rule.actions[0], m.AddContactTag) and rule.actions[0].tags == ["followed-up"]

    # a 422, as a typed problem naming the field
    refused = importlib.import_module(f"{PACKAGE}.api.contacts.v1_contacts_create").sync_detailed(
        client=typed, body=m.ContactCreate(phone="not a phone")
    )
    assert refused.status_code == 422
    problem = refused.parsed
    assert isinstance(problem, m.Problem) and problem.status == 422
    assert [error.field for error in problem.errors] == ["phone"]

    # the send lane's claim answers typed items; the bulk enrollment takes its Idempotency-Key header
    claimed = importlib.import_module(f"{PACKAGE}.api.send_lane.v1_send_lane_claim_claim").sync(
        client=typed, body=m.ClaimRequest()
    )
    assert isinstance(claimed, m.ClaimedMessageItems), claimed
    bulk = importlib.import_module(f"{PACKAGE}.api.bulk_enrollments.v1_bulk_enrollments_create")
    job = bulk.sync_detailed(
        client=typed,
        body=m.BulkCreate(sequence_id=sequence.id, contact_ids=[contact.id]),
        idempotency_key="first-bulk",
    )
    again = bulk.sync_detailed(
        client=typed,
        body=m.BulkCreate(sequence_id=sequence.id, contact_ids=[contact.id]),
        idempotency_key="first-bulk",
    )
    assert (job.status_code, again.status_code) == (202, 200)
    assert isinstance(again.parsed, m.BulkJob) and again.parsed.id == job.parsed.id
