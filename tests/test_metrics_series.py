"""Every metric seed 000 names is emitted, with the seed's labels, by the path that owns it: each path is
driven once, then ``/metrics`` is read and each series found there."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from litestar.testing import TestClient

from libs.common.ai.step import StepDue, run_step
from libs.common.core.metrics import FOLLOWUP_STEPS, labelled
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import AiStep, TemplateFallback
from services.release.release import release_batch
from services.retention.service import build as build_retention
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import stub_worker
from tests.rule_helpers import create_rule, process

#: Each series seed 000 names, with the labels it must carry (values as this test's paths produce them).
SEED_SERIES = {
    "whatstig_followup_steps_total": {"action": "queue", "outcome": "sent"},
    "whatstig_followup_release_lag_seconds_count": {},
    "whatstig_followup_enrollments_total": {"source": "rule", "result": "enrolled"},
    "whatstig_followup_finished_total": {"status": "stopped", "reason": "replied"},
    "whatstig_followup_triggers_total": {"type": "contact.created", "outcome": "executed"},
    "whatstig_ai_requests_total": {"kind": "followup", "outcome": "ai_unavailable"},
    "last_job_success": {"job": "followup-retention"},
}


def series(text: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of every sample in a Prometheus text exposition."""
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s", line)
        if match:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
            found.append((match.group(1), labels))
    return found


def test_each_seed_metric_is_emitted_with_its_labels(
    client: TestClient[Any], runtime: Runtime, project: Project
) -> None:
    pool, clock = runtime.pool, runtime.clock
    # a rule enrolls a new contact (triggers, enrollments by rule), the release queues the step (steps, lag)
    sequence = make_sequence(pool, project.id)
    create_rule(client, "contact.created", [{"type": "enroll_in_sequence", "sequence_id": str(sequence)}])
    contact = client.post("/v1/contacts", json={"phone": "+14155550199"}).json()["id"]
    assert process(runtime) == 1
    assert release_batch(pool, clock, runtime.settings.followup) == 1
    # a reply stops a live enrollment (finished)
    two_steps = make_sequence(pool, project.id)
    replier = make_contact(pool, project.id)
    make_enrollment(pool, clock, project.id, two_steps, replier)
    client.post(
        "/v1/events",
        json={"type": "message.inbound", "contact_id": str(replier), "provider_message_id": "wamid.metrics"},
    )
    # an AI step with no model configured takes its fallback (ai requests)
    ai = make_sequence(pool, project.id, AiStep(instructions="Ask", fallback=TemplateFallback(text="Hi")))
    make_enrollment(pool, clock, project.id, ai, make_contact(pool, project.id))
    leases: list[Any] = []
    release_batch(
        pool, clock, runtime.settings.followup, ai_lease=timedelta(minutes=2), on_lease=leases.append
    )
    [lease] = leases
    run_step(
        pool, clock, None, runtime.settings.followup, StepDue(project.id, lease.enrollment_id, 0, lease.fence)
    )
    # the retention job runs once (last_job_success)
    build_retention(runtime)
    actor = runtime.broker.get_actor("followup_retention")
    worker = stub_worker(runtime.broker, {actor.queue_name})
    worker.start()
    try:
        actor.send()
        runtime.broker.join(actor.queue_name)
        worker.join()
    finally:
        worker.stop()
    assert contact

    exposed = series(client.get("/metrics").text)
    for name, labels in SEED_SERIES.items():
        matching = [found for found_name, found in exposed if found_name == name]
        assert matching, f"/metrics has no {name}"
        assert any(labels.items() <= found.items() for found in matching), (
            f"/metrics has {name} but not with {labels}: {matching}"
        )


def test_a_kept_child_is_the_metrics_own_child() -> None:
    """core.metrics.labelled keeps ``labels()``'s child: the same series, counted where the metric counts."""
    child = labelled(FOLLOWUP_STEPS, "skip", "only_if")
    assert child is labelled(FOLLOWUP_STEPS, "skip", "only_if")
    assert child is FOLLOWUP_STEPS.labels("skip", "only_if")
