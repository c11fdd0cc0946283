"""The checks a body's handler runs once it decoded, run on a body that did not decode too.

A body with a wrong type is refused before its handler runs (:mod:`services.api.body`), so the checks that
follow decoding (a one-off's steps as published, a settings' windows, a rule's conditions) would answer
only on the next request, once the types are right. Instead the body is decoded with its refused parts
set aside (:func:`libs.common.core.decoding.salvaged`) and the value left is checked here, so one answer
names every error.

:data:`CHECKS` lists, for each body type, the domain's own check of it: the function its handler's domain
call runs, not a copy. Only checks that are pure functions of the body (and of the settings the runtime
holds) belong here: what needs the database waits for the handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libs.common.core.errors import Refusals
from libs.common.core.runtime import Runtime
from libs.common.followups import enrollments, sequences, shortcut
from libs.common.followups.enrollments import EnrollRequest
from libs.common.followups.project_settings import ProjectSettings, check_settings
from libs.common.followups.sequences import SequenceCreate, SequenceUpdate
from libs.common.followups.shortcut import FollowUpRequest
from libs.common.rules import rules
from libs.common.rules.rules import RuleCreate, RuleUpdate

#: A check of a decoded body: raises InvalidInput naming every field it refuses (what it returns is unused).
Check = Callable[[Any, Runtime], object]


def _settings(settings: ProjectSettings, runtime: Runtime) -> None:
    check_settings(settings, ai_token_cap=runtime.settings.ai.max_monthly_tokens_per_project)


#: Each body type's checks after decoding (a type not listed has none that need nothing stored).
CHECKS: dict[Any, Check] = {
    ProjectSettings: _settings,
    SequenceCreate: lambda data, _: sequences.check_draft(data),
    SequenceUpdate: lambda data, _: sequences.check_draft(data),
    EnrollRequest: lambda data, _: enrollments.check_request(data),
    FollowUpRequest: lambda data, _: shortcut.check_follow_up(data),
    RuleCreate: lambda data, _: rules.check_rule(data),
    RuleUpdate: lambda data, _: rules.check_rule(data),
}


def check_body(target: Any, value: Any, runtime: Runtime) -> list[tuple[str, str]]:
    """Every ``(field, message)`` the checks of ``target`` (a handler's body type) refuse in ``value``."""
    check = CHECKS.get(target)
    if check is None:
        return []
    refusals = Refusals()
    with refusals.check():
        check(value, runtime)
    return refusals.errors
