"""Polling loops and broker nudges (actors on the StubBroker).

The loop's own rules (back-off, work, failures) are driven tick by tick with a recording ``wait``: the
tests assert the sleeps the loop asks for, never how long anything took."""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import msgspec
import pytest
from dramatiq.brokers.stub import StubBroker
from psycopg_pool import ConnectionPool

from libs.common.contracts import actors
from libs.common.core import loops
from libs.common.core.loops import PollingLoop
from libs.common.core.runtime import Runtime
from services.release.service import RELEASE_LOOP, build
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows, stub_worker, wait_until

#: A poll interval no test waits out: a loop that sleeps it would hit the test timeout.
FOREVER = 3600.0


class Script:
    """Drives a loop in the calling thread: each tick returns the next scripted result (an int, or an
    exception to raise), each sleep is recorded instead of slept, and the loop stops when the script ends.
    ``log`` is what happened, in order: ``("tick", result)`` and ``("sleep", seconds)``."""

    def __init__(self, *results: int | Exception) -> None:
        self.results = list(results)
        self.log: list[tuple[str, object]] = []
        self.loop: PollingLoop | None = None

    def tick(self) -> int:
        result = self.results.pop(0)
        self.log.append(("tick", result if isinstance(result, int) else type(result).__name__))
        if not self.results:
            assert self.loop is not None
            self.loop.stop()  # the loop ends once this tick returns
        if isinstance(result, Exception):
            raise result
        return result

    def wait(self, wake: threading.Event, seconds: float) -> bool:
        if wake.is_set():
            return True  # a real wait returns at once: no sleep (after the last tick, stop() set it)
        self.log.append(("sleep", seconds))
        return False  # slept the whole time: nobody nudged

    def run(
        self, *, poll_interval: float, idle_max_sleep: float, next_due: loops.NextDue | None = None
    ) -> list[tuple[str, object]]:
        self.loop = PollingLoop(
            "t",
            self.tick,
            poll_interval=poll_interval,
            idle_max_sleep=idle_max_sleep,
            wait=self.wait,
            next_due=next_due,
        )
        self.loop.run()
        return self.log


def test_an_idle_loop_backs_off_to_its_maximum_sleep() -> None:
    log = Script(0, 0, 0, 0, 0, 0, 0).run(poll_interval=1, idle_max_sleep=5)
    # the first sleep is the poll interval, then it doubles up to the idle maximum, and stays there
    sleeps = (1, 2, 4, 5, 5, 5)
    assert log == [event for s in sleeps for event in (("tick", 0), ("sleep", s))] + [("tick", 0)]


def test_a_loop_that_knows_its_next_due_time_sleeps_until_then_never_past_the_poll_interval() -> None:
    # the next work falls due in 0.25 s, then in 30 s, then nothing is known, then it is overdue
    dues = iter([0.25, 30.0, None, -2.0])
    log = Script(0, 0, 0, 0, 0).run(poll_interval=1, idle_max_sleep=5, next_due=lambda: next(dues))
    margin = loops.DUE_MARGIN_SECONDS
    sleeps = (0.25 + margin, 1, 1, margin)  # no back-off: at most the poll interval, however long idle
    assert log == [event for s in sleeps for event in (("tick", 0), ("sleep", s))] + [("tick", 0)]


def test_a_loop_whose_next_due_time_fails_backs_off_as_usual() -> None:
    def unknown() -> float:
        raise ConnectionError("database unreachable")

    log = Script(0, 0, 0, 0).run(poll_interval=1, idle_max_sleep=5, next_due=unknown)
    assert log == [
        ("tick", 0),
        ("sleep", 1),
        ("tick", 0),
        ("sleep", 2),
        ("tick", 0),
        ("sleep", 4),
        ("tick", 0),
    ]


def test_a_loop_runs_again_at_once_while_there_is_work() -> None:
    log = Script(0, 0, 0, 1, 3, 1, 0, 0).run(poll_interval=1, idle_max_sleep=5)
    assert log == [
        ("tick", 0),
        ("sleep", 1),
        ("tick", 0),
        ("sleep", 2),
        ("tick", 0),
        ("sleep", 4),
        # work: the next tick follows at once, without a sleep in between ...
        ("tick", 1),
        ("tick", 3),
        ("tick", 1),
        # ... and once idle again the back-off starts over at the poll interval
        ("tick", 0),
        ("sleep", 1),
        ("tick", 0),
    ]


def test_a_failing_tick_does_not_kill_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="libs.common.core.loops"):
        log = Script(RuntimeError("boom"), RuntimeError("boom"), 1, RuntimeError("boom"), 0).run(
            poll_interval=1, idle_max_sleep=5
        )
    # a failed tick counts as an idle one (the loop backs off) and the loop goes on ticking
    assert log == [
        ("tick", "RuntimeError"),
        ("sleep", 1),
        ("tick", "RuntimeError"),
        ("sleep", 2),
        ("tick", 1),
        ("tick", "RuntimeError"),
        ("sleep", 1),
        ("tick", 0),
    ]
    failures = [r for r in caplog.records if r.getMessage() == "loop tick failed"]
    assert len(failures) == 3 and all(r.exc_info for r in failures)


def test_a_nudge_during_a_tick_ends_the_sleep_that_follows_it() -> None:
    seen: list[bool] = []
    loop: PollingLoop

    def tick() -> int:
        if not seen:
            loop.wake()  # a nudge arrives while the tick runs
        return 0

    def wait(wake: threading.Event, seconds: float) -> bool:
        seen.append(wake.is_set())  # set: a real wait returns at once
        if len(seen) == 2:
            loop.stop()
        return wake.is_set()

    loop = PollingLoop("t", tick, poll_interval=FOREVER, idle_max_sleep=FOREVER, wait=wait)
    loop.run()
    assert seen == [True, False]  # the nudge is not lost, and it ends only the one sleep


class Ticks:
    """Ticks counted by a loop's thread; a test waits for a count with a deadline."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def tick(self) -> int:
        with self._changed:
            self.count += 1
            self._changed.notify_all()
        return 0

    def wait_for(self, count: int, timeout: float = 10) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.count >= count, timeout), (self.count, count)


@pytest.fixture
def started() -> Iterator[Callable[[PollingLoop], PollingLoop]]:
    """Start loops in their threads; stop them after the test, whatever happened."""
    running: list[PollingLoop] = []

    def start(loop: PollingLoop) -> PollingLoop:
        running.append(loop)
        loop.start()
        return loop

    yield start
    for loop in running:
        loop.stop()


def test_a_nudge_cuts_a_sleep_short(started: Callable[[PollingLoop], PollingLoop]) -> None:
    ticks = Ticks()
    sleeping = threading.Event()
    woken: list[bool] = []

    def wait(wake: threading.Event, seconds: float) -> bool:
        sleeping.set()
        result = loops.wait_for_wake(wake, seconds)  # the loops' real sleep
        woken.append(result)
        return result

    # Given a loop asleep for an hour after its first tick
    loop = started(PollingLoop("t", ticks.tick, poll_interval=FOREVER, idle_max_sleep=FOREVER, wait=wait))
    assert sleeping.wait(10)
    # When it is nudged, Then it ticks again: the sleep ended because of the nudge, not the hour
    loop.wake()
    ticks.wait_for(2)
    assert woken == [True]


def test_a_nudge_wakes_a_loop_that_sleeps_the_default_way(
    started: Callable[[PollingLoop], PollingLoop],
) -> None:
    ticks = Ticks()
    loop = started(PollingLoop("t", ticks.tick, poll_interval=FOREVER, idle_max_sleep=FOREVER))
    ticks.wait_for(1)
    # whether the nudge lands during the first tick or the hour-long sleep after it, the loop ticks again
    loop.wake()
    ticks.wait_for(2)


def test_stop_ends_a_sleep_and_the_loop_thread(started: Callable[[PollingLoop], PollingLoop]) -> None:
    ticks = Ticks()
    name = f"loop-{uuid.uuid4().hex[:8]}"
    loop = started(PollingLoop(name, ticks.tick, poll_interval=FOREVER, idle_max_sleep=FOREVER))
    ticks.wait_for(1)
    loop.stop()  # joins the thread (for up to 10 s): the hour-long sleep must end at once
    assert name not in {thread.name for thread in threading.enumerate()}
    assert ticks.count == 1


def test_a_nudge_wakes_the_release_loop_long_before_its_next_poll(
    runtime: Runtime, pool: ConnectionPool, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a release loop that would sleep for a minute when idle
    slow = msgspec.structs.replace(
        runtime.settings.worker, poll_interval_seconds=60, idle_max_sleep_seconds=60
    )
    runtime.settings = dataclasses.replace(runtime.settings, worker=slow)
    asleep = threading.Event()
    real_wait = loops.wait_for_wake

    def watched(wake: threading.Event, seconds: float) -> bool:
        asleep.set()
        return real_wait(wake, seconds)

    monkeypatch.setattr(loops, "wait_for_wake", watched)  # the loop build() makes sleeps this way
    service = build(runtime)
    loop = service.loop(RELEASE_LOOP)
    worker = stub_worker(runtime.broker, {service.queue})
    worker.start()
    loop.start()
    try:
        assert asleep.wait(10)  # the loop found nothing and went to sleep
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
        wait_until(lambda: rows(pool, "SELECT count(*) FROM messages") != [(0,)], timeout=10)
    finally:
        loop.stop()
        worker.stop()


def test_a_malformed_nudge_fails_without_retry(runtime: Runtime) -> None:
    build(runtime)
    broker = runtime.broker
    assert isinstance(broker, StubBroker)
    failures: list[BaseException] = []
    event = threading.Event()

    class Watch(dramatiq.Middleware):
        def after_process_message(
            self,
            broker: dramatiq.Broker,
            message: dramatiq.MessageProxy,
            *,
            result: Any | None = None,
            exception: BaseException | None = None,
        ) -> None:
            if exception is not None:
                failures.append(exception)
                event.set()

    broker.add_middleware(Watch())
    worker = stub_worker(broker, {actors.RELEASE_QUEUE})
    worker.start()
    try:
        broker.enqueue(
            dramatiq.Message(
                queue_name=actors.RELEASE_QUEUE,
                actor_name=actors.RELEASE_NUDGE.actor,
                args=({"project_id": "not-a-uuid", "enrollment_id": str(uuid.uuid4())},),
                kwargs={},
                options={},
            )
        )
        assert event.wait(5)
        broker.join(actors.RELEASE_QUEUE, fail_fast=False)
        worker.join()
    finally:
        worker.stop()
    assert len(failures) == 1  # no retries
    assert "project_id" in str(failures[0])
    dead = broker.dead_letters
    assert len(dead) == 1
