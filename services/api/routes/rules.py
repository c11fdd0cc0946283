"""Rules: create, read, list, update, enable / disable, reorder, delete; what each rule did; webhook
deliveries and the key that signs them."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, Literal

from litestar import Controller, Request, delete, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody

from libs.common.platform import webhook_secrets
from libs.common.platform.conditions import Event
from libs.common.platform.webhook_secrets import RotateWebhookSecret, WebhookSecret
from libs.common.rules import dry_run, executions, rules, runs, webhooks
from libs.common.rules.dry_run import DryRun, DryRunRequest
from libs.common.rules.executions import Execution, ExecutionStatus
from libs.common.rules.rules import Rule, RuleCreate, RuleUpdate
from libs.common.rules.runs import RuleRun, RuleRunDetail
from libs.common.rules.webhooks import Delivery
from services.api.deps import PageLimit, ProjectId, page, runtime_of, transaction
from services.api.openapi import conflict, invalid, not_found
from services.api.routes import Items, Page, as_items, as_page
from services.api.scopes import scope

#: A sequence an ``enroll_in_sequence`` action names that is not one of the project's.
_UNKNOWN_SEQUENCE = not_found("A sequence an action names is not one of the project's.")


class RulesController(Controller):
    path = "/v1/rules"
    tags = ["rules"]

    @post("/", sync_to_thread=True, responses=_UNKNOWN_SEQUENCE)
    def create(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[RuleCreate]
    ) -> Rule:
        """Create a rule: when ``event`` happens and ``conditions`` hold, run ``actions`` (after
        ``execution_delay_minutes`` when set)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            rule = rules.create_rule(conn, project_id, data, now=runtime.clock.now())
        return rule

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
        event: FromQuery[Event | None] = None,
        active: FromQuery[bool | None] = None,
    ) -> Page[Rule]:
        """The project's rules in the order they run (position, then creation)."""
        with transaction(runtime_of(request)) as conn:
            rows = rules.list_rules(
                conn, project_id, limit=limit + 1, after=after, event=event, active=active
            )
        return as_page(page(rows, limit))

    @get("/{rule_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, rule_id: FromPath[uuid.UUID]
    ) -> Rule:
        with transaction(runtime_of(request)) as conn:
            return rules.get_rule(conn, project_id, rule_id)

    @patch("/{rule_id:uuid}", sync_to_thread=True, responses=_UNKNOWN_SEQUENCE)
    def update(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        rule_id: FromPath[uuid.UUID],
        data: JSONBody[RuleUpdate],
    ) -> Rule:
        """Change any of a rule's fields (``position`` reorders it); absent fields are kept."""
        return self._update(request, project_id, rule_id, data)

    @post("/{rule_id:uuid}/enable", sync_to_thread=True, status_code=200)
    def enable(
        self, request: Request[Any, Any, Any], project_id: ProjectId, rule_id: FromPath[uuid.UUID]
    ) -> Rule:
        return self._update(request, project_id, rule_id, RuleUpdate(active=True))

    @post("/{rule_id:uuid}/disable", sync_to_thread=True, status_code=200)
    def disable(
        self, request: Request[Any, Any, Any], project_id: ProjectId, rule_id: FromPath[uuid.UUID]
    ) -> Rule:
        return self._update(request, project_id, rule_id, RuleUpdate(active=False))

    def _update(
        self, request: Request[Any, Any, Any], project_id: uuid.UUID, rule_id: uuid.UUID, data: RuleUpdate
    ) -> Rule:
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            rule = rules.update_rule(conn, project_id, rule_id, data, now=runtime.clock.now())
        return rule

    @delete("/{rule_id:uuid}", sync_to_thread=True)
    def remove(
        self, request: Request[Any, Any, Any], project_id: ProjectId, rule_id: FromPath[uuid.UUID]
    ) -> None:
        """Delete a rule (its pending executions go with it)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            rules.delete_rule(conn, project_id, rule_id)

    @post(
        "/{rule_id:uuid}/dry-run",
        sync_to_thread=True,
        status_code=200,
        responses={
            **not_found(
                "The rule, the contact or the conversation is not one of the project's (or the conversation "
                "is not the contact's)."
            ),
            **invalid(
                "A well-formed value the server refuses: a conversation an event of the rule's type never "
                "has, or none where it always has one and the contact has no open one (`conversation_id`); "
                "event data over 16 KB as JSON (`event`)."
            ),
        },
    )
    def dry_run(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        rule_id: FromPath[uuid.UUID],
        data: JSONBody[DryRunRequest],
    ) -> DryRun:
        """Evaluate the rule now for a contact, without acting: each condition's result and the value it
        compared, the actions that would run, and for a delayed rule the episode and due time it would get.
        The trigger an event of the rule's type would record is recorded and rolled back: nothing is kept,
        nothing runs. The ``write`` scope, as every operation but a GET (a rule's author tests it)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return dry_run.dry_run(conn, project_id, rule_id, data, now=runtime.clock.now())

    @get("/{rule_id:uuid}/executions", sync_to_thread=True)
    def executions(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        rule_id: FromPath[uuid.UUID],
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
        status: FromQuery[ExecutionStatus | None] = None,
    ) -> Page[Execution]:
        """A delayed rule's executions, newest first: due_at, status (pending, executed, skipped),
        skip_reason (a code) and skip_detail, executed_at, message_id."""
        with transaction(runtime_of(request)) as conn:
            rules.get_rule(conn, project_id, rule_id)
            rows = executions.list_executions(
                conn, project_id, rule_id=rule_id, status=status, limit=limit + 1, after=after
            )
        return as_page(page(rows, limit))

    @post(
        "/{rule_id:uuid}/executions/{execution_id:uuid}/cancel",
        sync_to_thread=True,
        status_code=200,
        responses=conflict("The execution is no longer pending (it ran, or was skipped)."),
    )
    def cancel_execution(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        rule_id: FromPath[uuid.UUID],
        execution_id: FromPath[uuid.UUID],
    ) -> Execution:
        """Cancel a pending execution: it is skipped with reason ``cancelled`` and its actions never run."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return executions.cancel_execution(
                conn, project_id, rule_id, execution_id, now=runtime.clock.now()
            )

    @get("/{rule_id:uuid}/runs", sync_to_thread=True)
    def runs(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        rule_id: FromPath[uuid.UUID],
        limit: PageLimit = 50,
    ) -> Items[RuleRun]:
        """What the rule did with its latest triggers (executed, scheduled, or rejected: ``reason`` and
        ``reason_detail`` say why), newest first, each with its trace's short form (``conditions_summary``).
        A run's ``trigger_id`` is its id."""
        with transaction(runtime_of(request)) as conn:
            return as_items(runs.rule_runs(conn, project_id, rule_id, limit=limit))

    @get(
        "/{rule_id:uuid}/runs/{run_id:uuid}",
        sync_to_thread=True,
        responses=not_found("No such rule in the project, or no run of it for this trigger."),
    )
    def run(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        rule_id: FromPath[uuid.UUID],
        run_id: FromPath[uuid.UUID],
    ) -> RuleRunDetail:
        """One run (``run_id``: its ``trigger_id``) with its decision trace: the conditions as evaluated when
        it ran (each result and value), a delayed rule's episode and its execution, with the conditions as
        re-checked when it fell due and the guard that stopped it."""
        with transaction(runtime_of(request)) as conn:
            return runs.rule_run(conn, project_id, rule_id, run_id)


class WebhookDeliveriesController(Controller):
    path = "/v1/webhook-deliveries"
    tags = ["rules"]

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
        rule_id: FromQuery[uuid.UUID | None] = None,
        status: FromQuery[Literal["pending", "delivered", "failed"] | None] = None,
    ) -> Page[Delivery]:
        """The deliveries of ``send_webhook`` actions, each with its attempts and last result."""
        with transaction(runtime_of(request)) as conn:
            rows = webhooks.list_deliveries(
                conn, project_id, rule_id=rule_id, status=status, limit=limit + 1, after=after
            )
        return as_page(page(rows, limit))

    @get("/{delivery_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, delivery_id: FromPath[uuid.UUID]
    ) -> Delivery:
        with transaction(runtime_of(request)) as conn:
            return webhooks.get_delivery(conn, project_id, delivery_id)

    @get("/secret", sync_to_thread=True, opt=scope("admin"))
    def secret(self, request: Request[Any, Any, Any], project_id: ProjectId) -> WebhookSecret:
        """The key that signs the project's webhooks: ``X-Followups-Signature`` is ``sha256=`` and the hex
        HMAC-SHA256 of ``<X-Followups-Timestamp>.<body>`` (during a rotation's overlap, until
        ``previous_valid_until``, a comma-separated list: by this key, then by the one it replaced). A secret:
        admin keys only."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return webhook_secrets.webhook_secret(conn, project_id, now=runtime.clock.now())

    @post("/secret/rotate", sync_to_thread=True, status_code=200, opt=scope("admin"))
    def rotate_secret(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        data: JSONBody[RotateWebhookSecret | None] = None,
    ) -> WebhookSecret:
        """Replace the signing key; the old one still signs every delivery for ``overlap_seconds`` (default
        ``WEBHOOK_SECRET_OVERLAP_SECONDS``; 0 ends it at once), so receivers can switch without losing one."""
        runtime = runtime_of(request)
        given = data.overlap_seconds if data is not None else None
        seconds = runtime.settings.rules.webhook_secret_overlap_seconds if given is None else given
        with transaction(runtime) as conn:
            return webhook_secrets.rotate_webhook_secret(
                conn, project_id, overlap=timedelta(seconds=seconds), now=runtime.clock.now()
            )
