"""Cron schedules for periodic actors (retention)."""

from __future__ import annotations

import time
from typing import Any

import pendulum
from periodiq import cron

from libs.common.core.metrics import LAST_JOB_SUCCESS
from libs.common.core.runtime import Runtime
from libs.common.core.schedule import CronScheduler
from services.retention.service import FOLLOWUP_RETENTION_SCHEDULE, build
from tests.helpers import stub_worker, wait_until


class SoonSpec:
    """A periodic spec that is due a moment from now, then never again within the test."""

    def __init__(self, delay: float) -> None:
        self.at = pendulum.now("UTC").add(seconds=delay)

    def next_valid_date(self, last: Any) -> Any:
        return self.at if last < self.at else last.add(days=1)


class FakeActor:
    def __init__(self, spec: Any) -> None:
        self.actor_name = "fake"
        self.options = {"periodic": spec}
        self.sent: list[dict[str, Any]] = []

    def send_with_options(self, **options: Any) -> None:
        self.sent.append(options)


def test_the_scheduler_sends_a_due_actor_marked_with_its_schedule() -> None:
    actor = FakeActor(SoonSpec(0.3))
    idle = FakeActor(cron("0 0 1 1 *"))  # once a year: not due during the test
    scheduler = CronScheduler([actor, idle])
    scheduler.start()
    try:
        wait_until(lambda: actor.sent, timeout=5)
    finally:
        scheduler.stop()
    assert len(actor.sent) == 1
    assert "scheduled_at" in actor.sent[0]
    assert idle.sent == []


def test_the_retention_job_is_scheduled_daily_and_reports_success(runtime: Runtime) -> None:
    build(runtime)
    actor = runtime.broker.get_actor("followup_retention")
    assert str(actor.options["periodic"]) == str(cron(FOLLOWUP_RETENTION_SCHEDULE))
    before = time.time()
    worker = stub_worker(runtime.broker, {actor.queue_name})
    worker.start()
    try:
        actor.send()  # a manual run (periodiq skips only late scheduled runs)
        runtime.broker.join(actor.queue_name)
        worker.join()
    finally:
        worker.stop()
    assert LAST_JOB_SUCCESS.labels("followup-retention")._value.get() >= before
