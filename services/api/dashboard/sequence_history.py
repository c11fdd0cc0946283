"""What a sequence was and did: its published versions with what changed between two of them, and its
results (the funnel of its enrollments, the funnel per path of its branches, waits and splits, each
experiment's variants with their conversion intervals and the choice of a winner, the daily activity of the
last :data:`RESULT_DAYS` days).
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath

from libs.common.core.errors import FollowupsError, NotFound
from libs.common.followups import experiments, sequences, statistics
from libs.common.followups.definition import AiStep, MessageStep, SplitStep
from libs.common.followups.experiments import WinnerChoice
from libs.common.followups.statistics import control_kind_of
from services.api.dashboard import charts, diff
from services.api.dashboard.base import project_of, see_other
from services.api.dashboard.forms import Form, FormErrors, error_of
from services.api.dashboard.render import page
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of

#: Days the daily chart of a sequence's results shows.
RESULT_DAYS = 30
#: The newest versions the history page lists (a version's definition is read only to compare it).
HISTORY_VERSIONS = 200


class SequenceHistoryController(Controller):
    """A sequence's versions and results."""

    path = "/sequences"

    @get("/{sequence_id:uuid}/versions", sync_to_thread=True)
    def versions(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            sequence = sequences.get_sequence(conn, project_id, sequence_id)
            found = sequences.list_versions(conn, project_id, sequence_id, limit=HISTORY_VERSIONS)
            latest = found[0].version if found else None
            newer = _int(request.query_params.get("to"), latest)
            older = _int(request.query_params.get("from"), newer - 1 if newer else None)
            changes = None
            if older is not None and newer is not None and _comparable(older, newer, latest):
                # only the two versions compared are read with their definitions
                def builtins(number: int) -> Any:
                    return msgspec.to_builtins(
                        sequences.get_version(conn, project_id, sequence_id, number).definition
                    )

                after = builtins(newer)
                before = builtins(older) if older else {}
                changes = diff.definition_changes(before, after)
        return page(
            request,
            "sequences/versions.html",
            title=f"Versions · {sequence.name}",
            sequence=sequence,
            versions=found,
            older=older,
            newer=newer,
            changes=changes,
        )

    # --- results ---------------------------------------------------------------------------------------

    @get("/{sequence_id:uuid}/results", sync_to_thread=True)
    def results(self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID]) -> Response[str]:
        return results_page(request, sequence_id)

    @post("/{sequence_id:uuid}/experiments/{experiment:str}/winner", sync_to_thread=True)
    def choose_winner(
        self, request: Request[Any, Any, Any], sequence_id: FromPath[uuid.UUID], experiment: FromPath[str]
    ) -> Response[str]:
        """A variant's "Choose winner" button: ``POST /v1/sequences/{id}/experiments/{experiment}/winner``."""
        runtime = runtime_of(request)
        choice = WinnerChoice(variant=Form.of(request).get("variant")[:64])
        try:
            with transaction(runtime) as conn:
                experiments.choose_winner(
                    conn, project_of(request), sequence_id, experiment, choice, now=runtime.clock.now()
                )
        except FollowupsError as exc:
            if isinstance(exc, NotFound) and exc.field == "sequence_id":
                raise
            return results_page(request, sequence_id, errors=error_of(exc), status=status_of(exc))
        return see_other(f"/app/sequences/{sequence_id}/results", notice="winner_chosen")


def results_page(
    request: Request[Any, Any, Any],
    sequence_id: uuid.UUID,
    *,
    errors: FormErrors | None = None,
    status: int = 200,
) -> Response[str]:
    """A sequence's results: the numbers of ``GET /v1/sequences/{id}/statistics`` with their charts, and a
    "Choose winner" button for each variant of the current version's splits."""
    project_id = project_of(request)
    runtime = runtime_of(request)
    with transaction(runtime) as conn:
        sequence = sequences.get_sequence(conn, project_id, sequence_id)
        stats = statistics.sequence_statistics(conn, project_id, sequence_id)
        days = statistics.daily_activity(
            conn, project_id, sequence_id, days=RESULT_DAYS, now=runtime.clock.now()
        )
        current = (
            sequences.version_definition(conn, project_id, sequence.current_version_id)
            if sequence.current_version_id is not None
            else None
        )
    # the current version's steps that send nothing: their runs are paths, not messages
    routing = {
        index: charts.KIND_LABELS[control_kind_of(node)]
        for index, node in enumerate(current.steps if current else [])
        if not isinstance(node, MessageStep | AiStep)
    }
    choosable = {
        node.experiment: {v.name for v in node.variants}
        for node in (current.steps if current and sequence.status != "archived" else [])
        if isinstance(node, SplitStep)
    }
    return page(
        request,
        "sequences/results.html",
        status=status,
        title=f"Results · {sequence.name}",
        sequence=sequence,
        stats=stats,
        days=days,
        funnel=charts.funnel(stats),
        daily=charts.daily(days),
        paths=[(path, charts.path_label(path)) for path in stats.paths],
        path_funnel=charts.path_funnel(stats.paths),
        experiments=[(e, charts.intervals(e), choosable.get(e.experiment, set())) for e in stats.experiments],
        routing=routing,
        errors=errors or FormErrors(),
    )


def _comparable(older: int, newer: int, latest: int | None) -> bool:
    """Whether two version numbers name two versions of a sequence whose newest is ``latest`` (0: none)."""
    return latest is not None and older != newer and 1 <= newer <= latest and 0 <= older <= latest


def _int(raw: str | None, default: int | None) -> int | None:
    try:
        return int(raw) if raw else default
    except ValueError:
        return default
