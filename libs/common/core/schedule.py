"""Cron schedules for periodic actors (periodiq's ``cron`` specs), run in a thread of the worker.

periodiq's own scheduler needs the main thread (it sleeps on SIGALRM); this one runs beside the worker's
loops. It sends each due actor a message marked ``scheduled_at``, so periodiq's middleware skips a run
that waited too long in the queue. Scheduled jobs must be idempotent: with several schedulers running,
a job may run once per scheduler.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pendulum

log = logging.getLogger(__name__)


class CronScheduler:
    def __init__(self, actors: list[Any]) -> None:
        self._actors = [a for a in actors if "periodic" in a.options]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._actors:
            self._thread = threading.Thread(target=self.run, name="cron", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def run(self) -> None:
        last = pendulum.now("UTC")
        while not self._stop.is_set():
            # the next run strictly after the last one sent, so a run is never sent twice
            upcoming = sorted(
                ((a.options["periodic"].next_valid_date(last), a) for a in self._actors), key=lambda x: x[0]
            )
            due_at = upcoming[0][0]
            if self._stop.wait(max(0.0, (due_at - pendulum.now("UTC")).total_seconds())):
                return
            for when, actor in upcoming:
                if when == due_at:
                    extra = {"actor": actor.actor_name, "scheduled_at": str(when)}
                    log.info("scheduled job sent", extra=extra)
                    actor.send_with_options(scheduled_at=str(when))
            last = due_at
