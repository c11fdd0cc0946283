"""Rules: the list (event, conditions, actions, the "runs after 4h" badge), the form of seed 002 section 5.6
(execute immediately or after a delay in minutes, hours or days, stored in minutes; conditions in ``all`` /
``any`` groups), enable / disable / delete, a rule's executions (pending, executed, skipped and why), and
its test against a contact (a dry run: :mod:`.rule_dry_run`)."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath
from psycopg import Connection

from libs.common.core.errors import Conflict, FollowupsError
from libs.common.followups import sequences
from libs.common.rules import dry_run, executions, rules
from libs.common.rules import runs as rule_runs
from libs.common.rules.dry_run import DryRun
from libs.common.rules.rules import RuleCreate, RuleUpdate
from services.api.dashboard.action_form import (
    ACTION_CHOICES,
    ACTION_FIELDS,
    ACTION_TYPES,
    action_sequence_ids,
    actions_summary,
)
from services.api.dashboard.base import paged, project_of, see_other
from services.api.dashboard.condition_form import ATTRIBUTE_CHOICES, OPERATOR_CHOICES, VALUE_TYPES, summary
from services.api.dashboard.forms import Form, FormErrors, back_to_card, error_of, try_form, validation_error
from services.api.dashboard.queries import contact_labels, sequence_names
from services.api.dashboard.render import page
from services.api.dashboard.rule_dry_run import EVENT_EXAMPLE, FIELDS, DryRunForm, shown
from services.api.dashboard.rule_form import EVENTS, RuleForm
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of

EXECUTION_STATUSES = ("pending", "executed", "skipped")


class RulesController(Controller):
    path = "/rules"

    @get("/", sync_to_thread=True)
    def list(self, request: Request[Any, Any, Any]) -> Response[str]:
        project_id = project_of(request)
        after = request.query_params.get("after")
        with transaction(runtime_of(request)) as conn:
            rows = rules.list_rules(conn, project_id, limit=51, after=uuid.UUID(after) if after else None)
            items, cursor = paged(rows)
            names = sequence_names(
                conn, project_id, [i for rule in items for i in action_sequence_ids(rule.actions)]
            )
        return page(
            request,
            "rules/list.html",
            title="Rules",
            rules=[(rule, summary(rule.conditions), actions_summary(rule.actions, names)) for rule in items],
            cursor=cursor,
        )

    @get("/new", sync_to_thread=True)
    def new(self, request: Request[Any, Any, Any]) -> Response[str]:
        return self._form(request, RuleForm(), FormErrors(), rule_id=None)

    @post("/new", sync_to_thread=True)
    def create(self, request: Request[Any, Any, Any]) -> Response[str]:
        return self._submit(request, rule_id=None)

    @get("/{rule_id:uuid}", sync_to_thread=True)
    def detail(self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._detail(request, rule_id, DryRunForm(contact=request.query_params.get("contact") or ""))

    @post("/{rule_id:uuid}/test", sync_to_thread=True)
    def test(self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID]) -> Response[str]:
        """Test the rule against a contact (a dry run): the rule's page with what it would do."""
        project_id = project_of(request)
        runtime = runtime_of(request)
        typed = DryRunForm.of_form(Form.of(request))

        def attempt(conn: Connection[Any], errors: FormErrors) -> DryRun | None:
            data = typed.request(conn, project_id, errors)
            return dry_run.dry_run(conn, project_id, rule_id, data, now=runtime.clock.now()) if data else None

        tried = try_form(runtime, attempt, FIELDS, owner="rule_id")  # another project's rule: the 404 page
        return self._detail(
            request, rule_id, typed, tried=tried.answer, errors=tried.errors, status=tried.status
        )

    @get("/{rule_id:uuid}/runs/{run_id:uuid}", sync_to_thread=True)
    def run(
        self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID], run_id: FromPath[uuid.UUID]
    ) -> Response[str]:
        """One run of the rule and its decision trace: the conditions when it ran, and for a delayed rule
        its episode and execution, with the conditions when it fell due."""
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            rule = rules.get_rule(conn, project_id, rule_id)
            run = rule_runs.rule_run(conn, project_id, rule_id, run_id)
            names = contact_labels(conn, project_id, [run.contact_id])
        execution = run.execution
        return page(
            request,
            "rules/run.html",
            title=f"A run of {rule.name}",
            rule=rule,
            run=run,
            contact_name=names.get(run.contact_id, "erased contact"),
            tree=shown(run.conditions) if run.conditions else None,
            execution_tree=shown(execution.conditions) if execution and execution.conditions else None,
        )

    def _detail(
        self,
        request: Request[Any, Any, Any],
        rule_id: uuid.UUID,
        typed: DryRunForm,
        *,
        tried: DryRun | None = None,
        errors: FormErrors | None = None,
        status: int = 200,
    ) -> Response[str]:
        project_id = project_of(request)
        shown_status = request.query_params.get("status")
        shown_status = shown_status if shown_status in EXECUTION_STATUSES else None
        with transaction(runtime_of(request)) as conn:
            rule = rules.get_rule(conn, project_id, rule_id)
            found = executions.list_executions(
                conn, project_id, rule_id=rule_id, status=shown_status, limit=100
            )
            runs = rule_runs.rule_runs(conn, project_id, rule_id, limit=20)
            names = sequence_names(
                conn,
                project_id,
                action_sequence_ids(rule.actions) + action_sequence_ids(tried.actions if tried else []),
            )
        return page(
            request,
            "rules/detail.html",
            status=status,
            title=rule.name,
            rule=rule,
            conditions=summary(rule.conditions),
            actions=actions_summary(rule.actions, names),
            executions=found,
            runs=runs,
            status_filter=shown_status,
            statuses=EXECUTION_STATUSES,
            test=typed,
            errors=errors or FormErrors(),
            event_example=EVENT_EXAMPLE,
            tried=tried,
            tried_tree=shown(tried.conditions) if tried else None,
            tried_actions=actions_summary(tried.actions, names) if tried else [],
        )

    @get("/{rule_id:uuid}/edit", sync_to_thread=True)
    def edit(self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID]) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            rule = rules.get_rule(conn, project_of(request), rule_id)
        return self._form(request, RuleForm.of_rule(rule), FormErrors(), rule_id=rule_id)

    @post("/{rule_id:uuid}/edit", sync_to_thread=True)
    def update(self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID]) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            rules.get_rule(conn, project_of(request), rule_id)  # 404 for another project's rule
        return self._submit(request, rule_id=rule_id)

    @post("/{rule_id:uuid}/enable", sync_to_thread=True)
    def enable(self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._switch(request, rule_id, active=True)

    @post("/{rule_id:uuid}/disable", sync_to_thread=True)
    def disable(self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._switch(request, rule_id, active=False)

    @post("/{rule_id:uuid}/executions/{execution_id:uuid}/cancel", sync_to_thread=True)
    def cancel_execution(
        self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID], execution_id: FromPath[uuid.UUID]
    ) -> Response[str]:
        """Cancel one pending execution; back to the contact card it was pressed on, else the rule."""
        runtime = runtime_of(request)
        target = back_to_card(request, f"/app/rules/{rule_id}")
        try:
            with transaction(runtime) as conn:
                executions.cancel_execution(
                    conn, project_of(request), rule_id, execution_id, now=runtime.clock.now()
                )
        except Conflict:
            return see_other(target, notice="not_pending")
        return see_other(target, notice="cancelled")

    @post("/{rule_id:uuid}/delete", sync_to_thread=True)
    def delete(self, request: Request[Any, Any, Any], rule_id: FromPath[uuid.UUID]) -> Response[str]:
        project_id = project_of(request)
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            rules.delete_rule(conn, project_id, rule_id)
        return see_other("/app/rules", notice="deleted")

    def _switch(self, request: Request[Any, Any, Any], rule_id: uuid.UUID, *, active: bool) -> Response[str]:
        project_id = project_of(request)
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            rules.update_rule(conn, project_id, rule_id, RuleUpdate(active=active), now=runtime.clock.now())
        return see_other("/app/rules", notice="enabled" if active else "disabled")

    def _submit(self, request: Request[Any, Any, Any], *, rule_id: uuid.UUID | None) -> Response[str]:
        form = Form.of(request)
        rule_form = RuleForm.of_form(form)
        op = form.get("_op") or "save"
        if op != "save":
            rule_form.apply(op)
            return self._form(request, rule_form, FormErrors(), rule_id=rule_id)
        errors = FormErrors()
        payload = rule_form.payload(errors)
        if errors:
            return self._form(request, rule_form, errors, rule_id=rule_id, status=422)
        project_id = project_of(request)
        runtime = runtime_of(request)
        try:
            data = msgspec.convert(payload, RuleCreate)
            with transaction(runtime) as conn:
                if rule_id is None:
                    rule = rules.create_rule(conn, project_id, data, now=runtime.clock.now())
                else:
                    update = RuleUpdate(**{f: getattr(data, f) for f in payload})
                    rule = rules.update_rule(conn, project_id, rule_id, update, now=runtime.clock.now())
        except msgspec.ValidationError as exc:
            return self._form(request, rule_form, validation_error(exc), rule_id=rule_id, status=422)
        except FollowupsError as exc:
            return self._form(request, rule_form, error_of(exc), rule_id=rule_id, status=status_of(exc))
        return see_other(f"/app/rules/{rule.id}", notice="saved" if rule_id else "created")

    def _form(
        self,
        request: Request[Any, Any, Any],
        rule_form: RuleForm,
        errors: FormErrors,
        *,
        rule_id: uuid.UUID | None,
        status: int = 200,
    ) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            found = sequences.list_sequences(conn, project_of(request), limit=200, after=None, status=None)
        choices = [("", "choose…")] + [
            (str(s.id), f"{s.name} ({s.status})") for s in found if s.status != "archived"
        ]
        return page(
            request,
            "rules/form.html",
            status=status,
            title="New rule" if rule_id is None else "Edit rule",
            form=rule_form,
            errors=errors,
            rule_id=rule_id,
            events=[(e, e) for e in EVENTS],
            attributes=ATTRIBUTE_CHOICES,
            operators=OPERATOR_CHOICES,
            value_types=VALUE_TYPES,
            action_types=[(t, t.replace("_", " ")) for t in ACTION_TYPES],
            action_fields=ACTION_FIELDS,
            select_choices={"sequences": choices, **ACTION_CHOICES},
            units=[("minutes", "minutes"), ("hours", "hours"), ("days", "days")],
        )
