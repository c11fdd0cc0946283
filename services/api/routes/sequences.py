"""Sequences: drafts, published versions, pause / resume / archive, statistics."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, Response, get, patch, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody

from libs.common.followups import experiments, preview, sequences, statistics
from libs.common.followups.experiments import Winner, WinnerChoice
from libs.common.followups.preview import Preview, PreviewRequest
from libs.common.followups.sequences import (
    Published,
    Sequence,
    SequenceCreate,
    SequenceStatus,
    SequenceUpdate,
    Version,
    VersionSummary,
)
from libs.common.followups.statistics import SequenceStatistics
from services.api.deps import PageLimit, ProjectId, page, runtime_of, transaction
from services.api.openapi import conflict, invalid, not_found
from services.api.routes import Page, as_page

#: A sequence whose status does not allow the change (an archived sequence cannot be edited).
_STATUS_CONFLICT = conflict("The sequence's status does not allow this change (it is archived, say).")
#: A fixed sending number the definition names that is not one of the project's.
_UNKNOWN_NUMBER = not_found("The definition's `number_id` is not one of the project's numbers.")


class SequencesController(Controller):
    path = "/v1/sequences"
    tags = ["sequences"]

    @post("/", sync_to_thread=True, responses=_UNKNOWN_NUMBER)
    def create(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[SequenceCreate]
    ) -> Sequence:
        """Create a sequence as a draft (its definition may be incomplete until it is published)."""
        with transaction(runtime_of(request)) as conn:
            return sequences.create_sequence(conn, project_id, data)

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
        status: FromQuery[SequenceStatus | None] = None,
    ) -> Page[Sequence]:
        with transaction(runtime_of(request)) as conn:
            rows = sequences.list_sequences(conn, project_id, limit=limit + 1, after=after, status=status)
        return as_page(page(rows, limit))

    @get("/{sequence_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, sequence_id: FromPath[uuid.UUID]
    ) -> Sequence:
        with transaction(runtime_of(request)) as conn:
            return sequences.get_sequence(conn, project_id, sequence_id)

    @patch("/{sequence_id:uuid}", sync_to_thread=True, responses=_STATUS_CONFLICT)
    def update(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        sequence_id: FromPath[uuid.UUID],
        data: JSONBody[SequenceUpdate],
    ) -> Sequence:
        """Edit the draft; running enrollments keep the version they pinned."""
        with transaction(runtime_of(request)) as conn:
            return sequences.update_sequence(conn, project_id, sequence_id, data)

    @post(
        "/{sequence_id:uuid}/publish",
        sync_to_thread=True,
        status_code=201,
        responses={200: ResponseSpec(Published, description="The draft is the latest version: that version.")}
        | _STATUS_CONFLICT
        | invalid("The draft does not pass the checks of a published definition."),
    )
    def publish(
        self, request: Request[Any, Any, Any], project_id: ProjectId, sequence_id: FromPath[uuid.UUID]
    ) -> Response[Published]:
        """Freeze the draft as a new immutable version (201); new enrollments pin it. A draft identical to
        the latest version returns that version (200) and makes no new one. ``warnings`` names each
        placeholder without a fallback (the step is skipped for an enrollment that lacks its value)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            version, new = sequences.publish_sequence(conn, project_id, sequence_id, now=runtime.clock.now())
        return Response(sequences.with_warnings(version), status_code=201 if new else 200)

    @get("/{sequence_id:uuid}/versions", sync_to_thread=True)
    def versions(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        sequence_id: FromPath[uuid.UUID],
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
    ) -> Page[VersionSummary]:
        """A page of the published versions, newest first, without their definitions (read one version for
        its definition)."""
        with transaction(runtime_of(request)) as conn:
            rows = sequences.list_versions(conn, project_id, sequence_id, limit=limit + 1, after=after)
        return as_page(page(rows, limit))

    @get("/{sequence_id:uuid}/versions/{version:int}", sync_to_thread=True)
    def version(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        sequence_id: FromPath[uuid.UUID],
        version: FromPath[int],
    ) -> Version:
        """One published version, with its definition."""
        with transaction(runtime_of(request)) as conn:
            return sequences.get_version(conn, project_id, sequence_id, version)

    @post("/{sequence_id:uuid}/pause", sync_to_thread=True, status_code=200, responses=_STATUS_CONFLICT)
    def pause(
        self, request: Request[Any, Any, Any], project_id: ProjectId, sequence_id: FromPath[uuid.UUID]
    ) -> Sequence:
        """Pause: each running enrollment pauses when its next step comes up."""
        return self._change(request, project_id, sequence_id, "pause")

    @post("/{sequence_id:uuid}/resume", sync_to_thread=True, status_code=200, responses=_STATUS_CONFLICT)
    def resume(
        self, request: Request[Any, Any, Any], project_id: ProjectId, sequence_id: FromPath[uuid.UUID]
    ) -> Sequence:
        """Resume, with the enrollments the pause paused."""
        return self._change(request, project_id, sequence_id, "resume")

    @post("/{sequence_id:uuid}/archive", sync_to_thread=True, status_code=200, responses=_STATUS_CONFLICT)
    def archive(
        self, request: Request[Any, Any, Any], project_id: ProjectId, sequence_id: FromPath[uuid.UUID]
    ) -> Sequence:
        """Archive: no new enrollments; running ones carry on."""
        return self._change(request, project_id, sequence_id, "archive")

    @get("/{sequence_id:uuid}/statistics", sync_to_thread=True)
    def statistics(
        self, request: Request[Any, Any, Any], project_id: ProjectId, sequence_id: FromPath[uuid.UUID]
    ) -> SequenceStatistics:
        """Enrolled, active, completed, stopped by reason; per step: sent, skipped by reason, replies."""
        with transaction(runtime_of(request)) as conn:
            return statistics.sequence_statistics(conn, project_id, sequence_id)

    @post(
        "/{sequence_id:uuid}/experiments/{experiment:str}/winner",
        sync_to_thread=True,
        status_code=201,
        responses={
            200: ResponseSpec(
                Winner, description="The variant already won in the current version: no new version."
            )
        }
        | _STATUS_CONFLICT
        | invalid(
            "No split of the current version runs this `experiment` (or there is no published version), or"
            " the split has no such `variant`."
        ),
    )
    def choose_winner(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        sequence_id: FromPath[uuid.UUID],
        experiment: FromPath[str],
        data: JSONBody[WinnerChoice],
    ) -> Response[Winner]:
        """Choose the winner of an experiment: the current version with the split's ``winner`` set is
        published as a new version (201; the draft carries it too), so every enrollment that reaches the
        split from then on takes that variant, on an older version too. Choosing the variant that already
        won in the current version answers 200 and makes no new version."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            winner, new = experiments.choose_winner(
                conn, project_id, sequence_id, experiment, data, now=runtime.clock.now()
            )
        return Response(winner, status_code=201 if new else 200)

    @post(
        "/{sequence_id:uuid}/preview",
        sync_to_thread=True,
        status_code=200,
        responses={
            **not_found("The contact (`contact_id`, or `phone`) is not one of the project's."),
            **conflict("The sequence has no published version, or is archived: nobody can be enrolled."),
            **invalid(
                "A well-formed value the server refuses: neither or both of `contact_id` and `phone`, a "
                "phone that is not E.164 (`phone`), an `enrolled_at` in the past or over a year ahead, an "
                "`anchor_at` too near the ends of the calendar for the steps' offsets, `variables` over "
                "16 KB as JSON."
            ),
        },
    )
    def preview(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        sequence_id: FromPath[uuid.UUID],
        data: JSONBody[PreviewRequest],
    ) -> Preview:
        """The schedule a contact would get in the sequence's current version, under the current settings,
        without acting: each step's time (send window, pacing, caps, the contact's zone applied), its
        deferrals, its rendered text, or why it would be skipped; or why the contact could not be enrolled.
        The release path itself runs on an enrollment made and rolled back in a savepoint: nothing is kept,
        nothing is sent, the model is not called. The ``write`` scope, as every operation but a GET."""
        runtime = runtime_of(request)
        settings = runtime.settings
        with transaction(runtime) as conn:
            return preview.preview(
                conn,
                project_id,
                sequence_id,
                data,
                settings.followup,
                now=runtime.clock.now(),
                ai_lease=settings.ai.step_lease,
            )

    @staticmethod
    def _change(
        request: Request[Any, Any, Any], project_id: uuid.UUID, sequence_id: uuid.UUID, action: str
    ) -> Sequence:
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return sequences.change_sequence_status(
                conn, project_id, sequence_id, action, now=runtime.clock.now()
            )
