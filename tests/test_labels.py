"""The one catalogue of human labels (``libs/common/contracts/labels.py``): docs/labels.md is it written
out, and every code the product records of each kind has a label in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest

from libs.common.contracts.labels import ATTRIBUTES, EVENTS, REASONS, SOURCES, label, markdown
from libs.common.followups.definition import DefinitionWarning
from libs.common.followups.enrollments import StepRun
from libs.common.followups.stops import REASONS as STOP_REASONS
from libs.common.followups.transitions import EnrollmentReason, WaitingReason
from libs.common.ingress.apply import EventResult
from libs.common.platform.conditions import ATTRIBUTES as CONDITION_ATTRIBUTES
from libs.common.platform.conditions import Event
from libs.common.platform.messages import MessageSource
from libs.common.rules.bulk import BulkJob
from libs.common.rules.executions import Execution
from libs.common.rules.runs import RuleRun

DOCS = Path(__file__).resolve().parent.parent / "docs" / "labels.md"


def test_docs_labels_is_the_catalogue_written_out() -> None:
    assert DOCS.read_text() == markdown(), (
        "docs/labels.md is stale: python -m libs.common.contracts.labels > docs/labels.md"
    )


def test_every_recorded_code_has_a_label() -> None:
    assert sorted(set(get_args(Event)) - EVENTS.keys()) == []
    assert sorted(set(CONDITION_ATTRIBUTES) - ATTRIBUTES.keys()) == []
    assert sorted(set(STOP_REASONS.values()) - REASONS.keys()) == []
    enrollment_sources = {"api", "dashboard", "rule", "bulk", "campaign", "conversation"}
    assert sorted((set(get_args(MessageSource)) | enrollment_sources) - SOURCES.keys()) == []


@pytest.mark.parametrize(
    ("enum", "what"),
    [
        (EnrollmentReason, "Enrollment.reason"),
        (WaitingReason, "Enrollment.waiting_reason"),
        (get_type_hints(StepRun)["reason"], "StepRun.reason"),
        (get_type_hints(Execution)["skip_reason"], "Execution.skip_reason"),
        (get_type_hints(RuleRun)["reason"], "RuleRun.reason"),
        (get_type_hints(DefinitionWarning)["skip_reason"], "DefinitionWarning.skip_reason"),
        (get_type_hints(BulkJob)["skipped"], "BulkJob.skipped"),
        (get_type_hints(EventResult)["stop_reason"], "EventResult.stop_reason"),
    ],
)
def test_every_code_of_a_reason_enum_the_api_answers_has_a_label(enum: Any, what: str) -> None:
    codes = _codes(enum)
    assert codes, what
    assert sorted(codes - REASONS.keys()) == [], f"{what}: give each code its label in REASONS"


def _codes(enum: Any) -> set[str]:
    """The codes of a Literal, or of a type made of Literals (a union with None, a dict's keys)."""
    codes: set[str] = set()
    for arg in get_args(enum):
        codes |= {arg} if isinstance(arg, str) else _codes(arg)
    return codes


@pytest.mark.parametrize(
    ("code", "kind", "shown"),
    [
        ("contact.tag_added", "event", "Tag added to the contact"),
        ("replied", "reason", "Contact replied"),
        (
            "awaiting_agent:2026-12-01T18:06:57.73+00:00",
            "reason",
            "Waiting for an agent since: 2026-12-01 18:06:57 UTC",
        ),
        (
            "only_if:no_reply_since_previous_step",
            "reason",
            "Condition not met: no reply since the previous step",
        ),
        ("missing_variable:vars.plan", "reason", "A placeholder has no value: vars.plan"),
        ("contact.attributes.plan", "attribute", "Contact attribute “plan”"),
        ("dashboard", "source", "Dashboard"),
        ("something_new", "reason", "Something new"),
        (None, "reason", "—"),
    ],
)
def test_a_code_is_shown_by_its_label_or_readably(code: str | None, kind: str, shown: str) -> None:
    assert label(code, kind) == shown  # type: ignore[arg-type]


def test_a_reason_answered_with_its_detail_is_shown_as_it_was_stored() -> None:
    # the API answers the code and the detail apart; the dashboard shows them as one
    shown = label("only_if", "reason", "no_reply_since_previous_step")
    assert shown == label("only_if:no_reply_since_previous_step", "reason")
    assert shown == "Condition not met: no reply since the previous step"
    assert label("ai_fallback", "reason", "ai_low_confidence") == "AI fallback: model not confident"
    assert label("other", "reason", "retired_code:x") == "Other: retired code, x"
