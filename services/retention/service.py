"""Wiring of the retention service: periodic jobs on cron schedules."""

from __future__ import annotations

import logging
import time

import dramatiq
from periodiq import cron

from libs.common.contracts import actors
from libs.common.core.metrics import LAST_JOB_SUCCESS
from libs.common.core.runtime import Runtime, Service
from libs.common.rules import executions

log = logging.getLogger(__name__)

#: Rows deleted per transaction.
PRUNE_BATCH = 10_000
#: Daily at 03:15 UTC.
FOLLOWUP_RETENTION_SCHEDULE = "15 3 * * *"


def build(runtime: Runtime) -> Service:
    def followup_retention() -> None:
        """Daily clean-up: executed and skipped delayed-rule executions older than 30 days (a batch per
        transaction). The rest of the retention rules come with the retention work."""
        pruned = 0
        while True:
            with runtime.pool.connection() as conn:
                deleted = executions.prune(conn, now=runtime.clock.now())
            pruned += deleted
            if deleted < PRUNE_BATCH:
                break
        LAST_JOB_SUCCESS.labels("followup-retention").set(time.time())
        log.info("retention job done", extra={"job": "followup-retention", "rule_executions_pruned": pruned})

    dramatiq.actor(
        broker=runtime.broker,
        actor_name="followup_retention",
        queue_name=actors.RETENTION_QUEUE,
        periodic=cron(FOLLOWUP_RETENTION_SCHEDULE),
    )(followup_retention)
    return Service("retention", actors.RETENTION_QUEUE)
