"""Recorded reasons (``libs/common/core/reasons.py``): a step run's, a delayed execution's and a rule run's
reason is stored as ``code:detail`` and answered as a code of its enum (``reason``, ``skip_reason``) and
the detail apart (``reason_detail``, ``skip_detail``); the dashboard shows both by their labels, as before.
A row an older (or newer) version wrote with a code this one does not know reads as ``other``, its stored
text the detail, never an error; a bulk job counts such skips under ``other``."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from litestar.testing import TestClient

from libs.common.core.reasons import OTHER, split, stored
from libs.common.core.runtime import Runtime
from libs.common.followups.definition import MessageStep
from services.release.release import release_one
from tests.conftest import sign_in
from tests.dashboard_helpers import api
from tests.delayed_rule_helpers import (
    PENDING,
    counted,
    fire,
    of_rule,
    pending_since_ten,
    send,
    set_time,
)
from tests.factories import make_contact, make_enrollment, make_sequence, new_phone
from tests.helpers import rows
from tests.rule_helpers import create_rule

PLAN = send("Your plan: {{vars.plan}}")  # a rule's message has no variable plan: refused missing_variable


def test_a_stored_reason_splits_into_its_code_and_its_detail() -> None:
    codes = frozenset({"only_if", "past_due"})
    assert stored("only_if", "previous_not_read") == "only_if:previous_not_read"
    assert stored("past_due") == "past_due"
    assert split("only_if:previous_not_read", codes) == ("only_if", "previous_not_read")
    assert split("past_due", codes) == ("past_due", None)
    assert split(None, codes) == (None, None)
    # a code this version does not list: other, with the stored text whole
    assert split("retired_code:some detail", codes) == (OTHER, "retired_code:some detail")
    assert split("retired_code", codes) == (OTHER, "retired_code")


def test_a_step_run_answers_its_code_and_detail_and_an_unknown_code_reads_as_other(
    signed_in: Any, project: Any, runtime: Runtime, clock: Any
) -> None:
    client, _ = signed_in
    # Given an enrollment whose first step was skipped for a missing variable and whose second was queued
    sequence_id = make_sequence(
        runtime.pool,
        project.id,
        MessageStep(text="Hi {{vars.name}}"),
        MessageStep(text="Still there?", delay_seconds=60),
    )
    contact_id = make_contact(runtime.pool, project.id)
    enrollment = make_enrollment(runtime.pool, clock, project.id, sequence_id, contact_id)
    release_one(runtime.pool, clock, runtime.settings.followup)
    clock.advance(timedelta(seconds=60))
    release_one(runtime.pool, clock, runtime.settings.followup)
    assert rows(
        runtime.pool,
        "SELECT step_index, reason FROM followup_step_runs WHERE enrollment_id = %s ORDER BY 1",
        enrollment.id,
    ) == [(0, "missing_variable:vars.name"), (1, None)]  # stored as before
    # and the second's reason as a version with a code this one does not know wrote it
    rows(
        runtime.pool,
        "UPDATE followup_step_runs SET reason = 'retired_code:kept as written'"
        " WHERE enrollment_id = %s AND step_index = 1 RETURNING 1",
        enrollment.id,
    )

    # When it is read through the API
    detail = api(client, project, "GET", f"/v1/enrollments/{enrollment.id}")

    # Then each step run has its code and, apart, what it is about; the unknown code reads as other
    assert [(r["outcome"], r["reason"], r["reason_detail"]) for r in detail["step_runs"]] == [
        ("skipped", "missing_variable", "vars.name"),
        ("queued", "other", "retired_code:kept as written"),
    ]
    # and the dashboard's timeline shows the label of the code, then the detail
    timeline = client.get(f"/app/enrollments/{enrollment.id}/timeline").text
    assert "reason: A placeholder has no value: vars.name" in timeline
    assert "Other: retired code, kept as written" in timeline


def test_an_execution_and_a_rule_run_refused_for_a_missing_value_name_it_apart(
    signed_in: Any, project: Any, runtime: Runtime
) -> None:
    client, _ = signed_in
    client.headers.update(project.headers)  # the API's calls of the helpers, beside the dashboard's session
    # Given a delayed rule and an immediate one whose message lacks a value, on a conversation gone Pending
    delayed = create_rule(client, "conversation.updated", [PLAN], PENDING, execution_delay_minutes=240)
    immediate = create_rule(client, "conversation.updated", [PLAN], PENDING)
    pending_since_ten(client, runtime, delayed)
    before = counted("skipped", "missing_variable")

    # When the delayed one falls due
    set_time(runtime, "2030-01-07T14:00")
    fire(runtime)

    # Then both were refused missing_variable, the placeholder apart; the metric's label is the code alone
    [execution] = of_rule(client, delayed)
    assert (execution["status"], execution["skip_reason"], execution["skip_detail"]) == (
        "skipped",
        "missing_variable",
        "vars.plan",
    )
    assert counted("skipped", "missing_variable") - before == 1
    [run] = runs_of(client, immediate)
    assert (run["outcome"], run["reason"], run["reason_detail"]) == (
        "rejected",
        "missing_variable",
        "vars.plan",
    )
    # stored as before, one column each
    assert rows(runtime.pool, "SELECT skip_reason FROM rule_pending_executions") == [
        ("missing_variable:vars.plan",)
    ]
    assert rows(runtime.pool, "SELECT detail FROM rule_runs WHERE rule_id = %s", uuid.UUID(immediate)) == [
        ("missing_variable:vars.plan",)
    ]
    # and the dashboard shows the label of each, then the placeholder (signed in again: years went by)
    sign_in(client, project)
    for rule in (delayed, immediate):
        assert "A placeholder has no value: vars.plan" in client.get(f"/app/rules/{rule}").text

    # When an older version's codes are read
    rows(runtime.pool, "UPDATE rule_pending_executions SET skip_reason = 'retired_code' RETURNING 1")
    rows(runtime.pool, "UPDATE rule_runs SET detail = 'retired_code:x' RETURNING 1")

    # Then they read as other, with their stored text
    [execution] = of_rule(client, delayed)
    assert (execution["skip_reason"], execution["skip_detail"]) == ("other", "retired_code")
    [run] = runs_of(client, immediate)
    assert (run["reason"], run["reason_detail"]) == ("other", "retired_code:x")


def test_a_bulk_job_counts_a_skip_reason_it_does_not_know_as_other(
    signed_in: Any, project: Any, runtime: Runtime
) -> None:
    client, _ = signed_in
    sequence_id = make_sequence(runtime.pool, project.id)
    body = {"sequence_id": str(sequence_id), "phones": [new_phone()]}
    job = api(client, project, "POST", "/v1/bulk-enrollments", json=body)
    # Given a job whose counts an older version wrote with a reason this one does not know
    rows(
        runtime.pool,
        """UPDATE followup_bulk_jobs SET skipped = '{"invalid_phone": 2, "retired": 3, "retired_too": 1}'"""
        " WHERE id = %s RETURNING 1",
        uuid.UUID(job["id"]),
    )
    # When it is read, the unknown ones are counted as other
    read = api(client, project, "GET", f"/v1/bulk-enrollments/{job['id']}")
    assert read["skipped"] == {"invalid_phone": 2, "other": 4}


def runs_of(client: TestClient[Any], rule_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/rules/{rule_id}/runs")
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items
