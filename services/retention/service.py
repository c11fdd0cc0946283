"""Wiring of the retention service: periodic jobs on cron schedules."""

from __future__ import annotations

import logging
import time

import dramatiq
from periodiq import cron

from libs.common.contracts import actors
from libs.common.core.errors import DatabaseUnavailable
from libs.common.core.metrics import LAST_JOB_SUCCESS
from libs.common.core.runtime import Runtime, Service
from libs.common.retention.cleanup import run_retention

log = logging.getLogger(__name__)

#: Daily at 03:15 UTC.
FOLLOWUP_RETENTION_SCHEDULE = "15 3 * * *"
#: A run cut short by a PostgreSQL outage is tried again this much later (ms), a few times.
OUTAGE_RETRY_MS = 60_000
OUTAGE_RETRIES = 10


def build(runtime: Runtime) -> Service:
    def followup_retention() -> None:
        """The daily clean-up (``libs.common.retention.cleanup``): ``last_job_success`` moves only after a
        run in which every step succeeded."""
        try:
            ok = run_retention(runtime.pool, runtime.clock.now)
        except DatabaseUnavailable:
            log.info(
                "retention job cut short by the outage: tried again later",
                extra={"job": "followup-retention"},
            )
            raise dramatiq.Retry(delay=OUTAGE_RETRY_MS) from None
        if ok:
            LAST_JOB_SUCCESS.labels("followup-retention").set(time.time())
            log.info("retention job done", extra={"job": "followup-retention"})
        elif ok is False:
            log.error("retention job failed: see the failed step above", extra={"job": "followup-retention"})

    dramatiq.actor(
        broker=runtime.broker,
        actor_name="followup_retention",
        queue_name=actors.RETENTION_QUEUE,
        periodic=cron(FOLLOWUP_RETENTION_SCHEDULE),
        max_retries=OUTAGE_RETRIES,
    )(followup_retention)
    return Service("retention", actors.RETENTION_QUEUE)
