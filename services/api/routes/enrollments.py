"""Enrollments: enroll, read (with step runs and messages), list, pause, resume, stop, reschedule."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, Response, get, patch, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody

from libs.common.followups import enrollments
from libs.common.followups.enrollments import EnrollmentDetail, EnrollmentUpdate, EnrollRequest, StopRequest
from libs.common.followups.transitions import Enrollment, EnrollmentStatus
from services.api.deps import PageLimit, ProjectId, page, runtime_of, transaction
from services.api.openapi import conflict, not_found
from services.api.routes import Page, as_page

#: An enrollment that is not live (or not paused, to resume): the transition does not apply.
_NOT_LIVE = conflict("The enrollment's status does not allow this change (it finished, say).")


class EnrollmentsController(Controller):
    path = "/v1/enrollments"
    tags = ["enrollments"]

    @post(
        "/",
        sync_to_thread=True,
        responses={
            200: ResponseSpec(Enrollment, description="The existing enrollment for this `dedupe_key`.")
        }
        | not_found("No such sequence or contact in the project.")
        | conflict(
            "The enrollment is refused; `code` says why: `already_enrolled`, `reentry_not_allowed`, "
            "`opted_out`, `plan_limit`, `sequence_not_enrollable`."
        ),
    )
    def enroll(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[EnrollRequest]
    ) -> Response[Enrollment]:
        """Enroll a contact (201); a known ``dedupe_key`` returns the existing enrollment (200)."""
        runtime = runtime_of(request)
        now = runtime.clock.now()
        with transaction(runtime) as conn:
            enrollment, created = enrollments.enroll(conn, project_id, data, now=now)
        return Response(enrollment, status_code=201 if created else 200)

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
        sequence_id: FromQuery[uuid.UUID | None] = None,
        contact_id: FromQuery[uuid.UUID | None] = None,
        status: FromQuery[EnrollmentStatus | None] = None,
    ) -> Page[Enrollment]:
        with transaction(runtime_of(request)) as conn:
            rows = enrollments.list_enrollments(
                conn,
                project_id,
                limit=limit + 1,
                after=after,
                sequence_id=sequence_id,
                contact_id=contact_id,
                status=status,
            )
        return as_page(page(rows, limit))

    @get("/{enrollment_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, enrollment_id: FromPath[uuid.UUID]
    ) -> EnrollmentDetail:
        """The enrollment with its step runs and the messages it queued."""
        with transaction(runtime_of(request)) as conn:
            return enrollments.get_enrollment_detail(conn, project_id, enrollment_id)

    @patch("/{enrollment_id:uuid}", sync_to_thread=True, responses=_NOT_LIVE)
    def update(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        enrollment_id: FromPath[uuid.UUID],
        data: JSONBody[EnrollmentUpdate],
    ) -> Enrollment:
        """Change variables, or reschedule with a new ``anchor_at``."""
        runtime = runtime_of(request)
        now = runtime.clock.now()
        with transaction(runtime) as conn:
            enrollment = enrollments.update_enrollment(conn, project_id, enrollment_id, data, now=now)
        return enrollment

    @post("/{enrollment_id:uuid}/pause", sync_to_thread=True, status_code=200, responses=_NOT_LIVE)
    def pause(
        self, request: Request[Any, Any, Any], project_id: ProjectId, enrollment_id: FromPath[uuid.UUID]
    ) -> Enrollment:
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return enrollments.pause_enrollment(conn, project_id, enrollment_id, now=runtime.clock.now())

    @post("/{enrollment_id:uuid}/resume", sync_to_thread=True, status_code=200, responses=_NOT_LIVE)
    def resume(
        self, request: Request[Any, Any, Any], project_id: ProjectId, enrollment_id: FromPath[uuid.UUID]
    ) -> Enrollment:
        runtime = runtime_of(request)
        now = runtime.clock.now()
        with transaction(runtime) as conn:
            enrollment = enrollments.resume_enrollment(conn, project_id, enrollment_id, now=now)
        return enrollment

    @post("/{enrollment_id:uuid}/stop", sync_to_thread=True, status_code=200, responses=_NOT_LIVE)
    def stop(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        enrollment_id: FromPath[uuid.UUID],
        data: JSONBody[StopRequest | None] = None,
    ) -> Enrollment:
        """Stop by hand (reason ``manual``), with an optional ``note``."""
        runtime = runtime_of(request)
        note = data.note if data is not None else None
        with transaction(runtime) as conn:  # the stop is counted once committed (an after-commit effect)
            enrollment, _ = enrollments.stop_enrollment(
                conn, project_id, enrollment_id, note=note, now=runtime.clock.now()
            )
        return enrollment
