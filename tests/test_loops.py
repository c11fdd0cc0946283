"""Polling loops and broker nudges (actors on the StubBroker)."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import uuid

import dramatiq
import msgspec
from psycopg_pool import ConnectionPool

from libs.common.contracts import actors
from libs.common.core.loops import PollingLoop
from libs.common.core.runtime import Runtime
from services.release.service import RELEASE_LOOP, build
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence


def test_an_idle_loop_backs_off_to_its_maximum_sleep() -> None:
    ticks: list[float] = []
    loop = PollingLoop(
        "t", lambda: ticks.append(time.monotonic()) or 0, poll_interval=0.05, idle_max_sleep=0.2
    )
    loop.start()
    time.sleep(1.0)
    loop.stop()
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert gaps[0] >= 0.05  # first sleep is the poll interval ...
    assert gaps[-1] >= 0.2 > gaps[0]  # ... then it doubles up to the idle maximum ...
    assert max(gaps) < 1.0  # ... and stays there (generous slack for a busy machine)


def test_a_loop_runs_again_at_once_while_there_is_work() -> None:
    remaining = [5]

    def tick() -> int:
        if remaining[0]:
            remaining[0] -= 1
            return 1
        return 0

    loop = PollingLoop("t", tick, poll_interval=10, idle_max_sleep=10)
    loop.start()
    deadline = time.monotonic() + 2
    while remaining[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.stop()
    assert remaining == [0]


def test_a_failing_tick_does_not_kill_the_loop() -> None:
    calls = []

    def tick() -> int:
        calls.append(1)
        raise RuntimeError("boom")

    loop = PollingLoop("t", tick, poll_interval=0.01, idle_max_sleep=0.02)
    loop.start()
    time.sleep(0.3)
    loop.stop()
    assert len(calls) > 3


def test_a_nudge_wakes_the_release_loop_long_before_its_next_poll(
    runtime: Runtime, pool: ConnectionPool, project: Project
) -> None:
    # Given a release loop that would sleep for a minute when idle
    slow = msgspec.structs.replace(
        runtime.settings.worker, poll_interval_seconds=60, idle_max_sleep_seconds=60
    )
    runtime.settings = dataclasses.replace(runtime.settings, worker=slow)
    service = build(runtime)
    loop = service.loop(RELEASE_LOOP)
    worker = dramatiq.Worker(runtime.broker, queues={service.queue}, worker_threads=1)
    worker.start()
    loop.start()
    try:
        time.sleep(0.2)  # the loop found nothing and went to sleep
        sequence = make_sequence(pool, project.id)
        enrollment = make_enrollment(
            pool, runtime.clock, project.id, sequence, make_contact(pool, project.id)
        )
        # When a nudge arrives over the broker
        actors.send(
            runtime.broker,
            actors.RELEASE_NUDGE,
            actors.ReleaseNudge(project_id=project.id, enrollment_id=enrollment.id),
        )
        # Then the step is released within seconds, not a minute
        deadline = time.monotonic() + 10
        released = False
        while time.monotonic() < deadline and not released:
            with pool.connection() as conn:
                released = bool(conn.execute("SELECT count(*) FROM messages").fetchone()[0])  # type: ignore[index]
            time.sleep(0.05)
        assert released
    finally:
        loop.stop()
        worker.stop()


def test_a_malformed_nudge_fails_without_retry(runtime: Runtime) -> None:
    build(runtime)
    failures: list[BaseException] = []
    event = threading.Event()

    class Watch(dramatiq.Middleware):
        def after_process_message(self, broker, message, *, result=None, exception=None):  # type: ignore[no-untyped-def]
            if exception is not None:
                failures.append(exception)
                event.set()

    runtime.broker.add_middleware(Watch())
    worker = dramatiq.Worker(runtime.broker, queues={actors.RELEASE_QUEUE}, worker_threads=1)
    worker.start()
    try:
        runtime.broker.enqueue(
            dramatiq.Message(
                queue_name=actors.RELEASE_QUEUE,
                actor_name=actors.RELEASE_NUDGE.actor,
                args=({"project_id": "not-a-uuid", "enrollment_id": str(uuid.uuid4())},),
                kwargs={},
                options={},
            )
        )
        assert event.wait(5)
        runtime.broker.join(actors.RELEASE_QUEUE, fail_fast=False)
        worker.join()
    finally:
        worker.stop()
    assert len(failures) == 1  # no retries
    assert "project_id" in str(failures[0])
    dead = runtime.broker.dead_letters
    assert len(dead) == 1
