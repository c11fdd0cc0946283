"""Prometheus metrics, named as in seed 000's Observability section.

Safe with several processes: when ``PROMETHEUS_MULTIPROC_DIR`` is set (as the compose file does),
prometheus-client writes samples to files there and :func:`exposition_registry` aggregates every
process's samples for the ``/metrics`` endpoint.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics import MetricWrapperBase

#: Label values are kept to closed sets (action, outcome, reason) so the series count stays bounded.
FOLLOWUP_STEPS: Final = Counter(
    "whatstig_followup_steps_total",
    "Follow-up steps handled by the release path, by action and outcome.",
    ["action", "outcome"],
)
FOLLOWUP_RELEASE_LAG: Final = Histogram(
    "whatstig_followup_release_lag_seconds",
    "Queued time minus due time of released follow-up steps.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600),
)
FOLLOWUP_ENROLLMENTS: Final = Counter(
    "whatstig_followup_enrollments_total",
    "Enrollment attempts, by source and result.",
    ["source", "result"],
)
FOLLOWUP_FINISHED: Final = Counter(
    "whatstig_followup_finished_total",
    "Enrollments that finished, by status and reason.",
    ["status", "reason"],
)
FOLLOWUP_CONVERSIONS: Final = Counter(
    "whatstig_followup_conversions_total",
    "Goals met by enrollments: live ones converted (late false), finished ones inside their sequence's "
    "conversion window (late true).",
    ["late"],
)
FOLLOWUP_PREVIEWS: Final = Counter(
    "whatstig_followup_previews_total",
    "Sequence previews, by result: complete, incomplete (a step still deferred), or the rejection.",
    ["result"],
)
FOLLOWUP_EXPERIMENT_WINNERS: Final = Counter(
    "followups_experiment_winners_total",
    "Winners chosen for a sequence's experiment, by result: chosen (a new version published) or unchanged.",
    ["result"],
)
FOLLOWUP_TRIGGERS: Final = Counter(
    "whatstig_followup_triggers_total",
    "Rule triggers processed, by type and outcome.",
    ["type", "outcome"],
)
TRIGGER_RULES_RUN_AGAIN: Final = Counter(
    "followups_trigger_rules_run_again_total",
    "Leased triggers whose rules, run together first, ran again one by one (one was refused or failed).",
    ["type"],
)
RULE_EXECUTIONS: Final = Counter(
    "whatstig_rule_executions_total",
    "Delayed rule executions the sweep finished, by outcome (executed, skipped, retry) and reason.",
    ["outcome", "reason"],
)
RULE_EXECUTION_LAG: Final = Histogram(
    "whatstig_rule_execution_lag_seconds",
    "Time a delayed rule execution was executed or skipped minus its due time.",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600),
)
RULE_PENDING_EXECUTIONS: Final = Gauge(
    "whatstig_rule_pending_executions",
    "Delayed rule executions waiting for their time.",
    multiprocess_mode="livemax",
)
PROVIDER_ERRORS: Final = Counter(
    "followups_provider_errors_total",
    "Failures the providers reported (message.status FAILED with an error_code), by class of code"
    " (marketing_limit, outside_service_window, undeliverable, rate_limit, other).",
    ["code_class"],
)
WEBHOOK_DELIVERIES: Final = Counter(
    "whatstig_webhook_deliveries_total",
    "Webhook delivery attempts of rules, by outcome (delivered, retry: will be retried, failed: given up).",
    ["outcome"],
)
WEBHOOK_ATTEMPT_ERRORS: Final = Counter(
    "followups_webhook_attempt_errors_total",
    "Webhook attempts that failed, by error class (blocked_address, timeout, connect_refused, http, ...).",
    ["error"],
)
WEBHOOK_IN_FLIGHT: Final = Gauge(
    "followups_webhook_deliveries_in_flight",
    "Webhook attempts a triggers process is making right now.",
    multiprocess_mode="livesum",
)
WEBHOOK_SECRET_ROTATIONS: Final = Counter(
    "followups_webhook_secret_rotations_total",
    "Webhook signing secrets rotated, by kind (overlap: the old one signs too until the overlap ends;"
    " immediate: it ended at once).",
    ["kind"],
)
AI_REQUESTS: Final = Counter(
    "whatstig_ai_requests_total",
    "Model requests, by kind and outcome.",
    ["kind", "outcome"],
)
AI_DRAFTS_REFUSED: Final = Counter(
    "whatstig_ai_drafts_refused_total",
    "Model answers refused by the judge (fallback ai_invalid_output), by the rule they broke.",
    ["problem"],
)
OUTBOX_PUBLISHED: Final = Counter(
    "followups_outbox_published_total",
    "Domain events relayed from the outbox to the events exchange.",
    ["type"],
)
RETENTION_DELETED: Final = Counter(
    "whatstig_retention_rows_deleted_total",
    "Rows the retention job deleted, by table.",
    ["table"],
)
FOLLOWUP_LIVE_DRIFT: Final = Counter(
    "whatstig_followup_live_count_drift_total",
    "Live enrollments the retention job's recount found miscounted by a project's live-enrollment counter"
    " (what a plan limit reads), by direction (over: the counter said more, under: fewer); corrected.",
    ["direction"],
)
OUTBOX_OLDEST_UNPUBLISHED: Final = Gauge(
    "followups_outbox_oldest_unpublished_seconds",
    "Age of the oldest domain event not yet relayed to RabbitMQ (0: none waits).",
    multiprocess_mode="livemax",
)
ACTOR_MESSAGES: Final = Counter(
    "followups_actor_messages_total",
    "Messages processed by actors, by actor and outcome (failed: dead-lettered).",
    ["actor", "outcome"],
)
ACTOR_DURATION: Final = Histogram(
    "followups_actor_duration_seconds", "Time actors spend on a message.", ["actor"]
)
BROKER_MESSAGES_DROPPED: Final = Counter(
    "followups_broker_messages_dropped_total",
    "Fire-and-forget RabbitMQ messages dropped rather than waited for, by kind (nudge, invalidation) and "
    "reason (queue_full, broker_unavailable).",
    ["kind", "reason"],
)
LAST_JOB_SUCCESS: Final = Gauge(
    "last_job_success",
    "Unix time of the last successful run of a scheduled job (for example followup-retention).",
    ["job"],
    multiprocess_mode="max",
)
API_AUTH_REFUSALS: Final = Counter(
    "followups_api_auth_refusals_total",
    "REST requests refused by their API key, by reason (unauthorized: no live key, 401; missing_scope: "
    "its scope does not grant the route, 403).",
    ["reason"],
)

API_THROTTLED: Final = Counter(
    "followups_api_throttled_total",
    "Requests the API refused with 429, by limit (signin_failures, auth_failures, key_requests).",
    ["limit"],
)

SEND_LANE_SENDS: Final = Counter(
    "whatstig_send_lane_sends_total",
    "Provider send attempts of the send lane, by provider and outcome (sent, retry, unconfirmed, rejected,"
    " expired).",
    ["provider", "outcome"],
)
SEND_LANE_SEND_SECONDS: Final = Histogram(
    "whatstig_send_lane_send_seconds",
    "Time of one provider send attempt, by provider.",
    ["provider"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
SEND_LANE_IN_FLIGHT: Final = Gauge(
    "whatstig_send_lane_in_flight",
    "Provider send attempts in flight in this process.",
    multiprocess_mode="livesum",
)
PROVIDER_WEBHOOKS: Final = Counter(
    "whatstig_provider_webhooks_total",
    "Provider webhook requests, by provider and outcome (applied, bad_signature, unknown_number, invalid,"
    " verified, verify_refused).",
    ["provider", "outcome"],
)

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST


def exposition_registry() -> CollectorRegistry | None:
    """The registry to expose: every process's samples in multiprocess mode, else the default."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return None


def render() -> bytes:
    """The Prometheus text exposition of this process (or of all processes, in multiprocess mode)."""
    registry = exposition_registry()
    return generate_latest(registry) if registry is not None else generate_latest()


def labelled(metric: MetricWrapperBase, *values: str) -> Any:
    """``metric.labels(*values)``, the child kept: prometheus_client checks the values and takes a lock at
    every ``labels()`` call, and a hot path (a release step) asks for the same few children again and again.
    Every metric's label values are bounded categories, so the children kept are too; no metric here is
    ever cleared (a cleared metric's kept child would count apart from it)."""
    return _child(metric, values)


@functools.cache
def _child(metric: MetricWrapperBase, values: tuple[str, ...]) -> Any:
    return metric.labels(*values)
