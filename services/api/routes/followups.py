"""Sequences and enrollments."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import FromPath, JSONBody

from libs.common import enrollments, sequences
from libs.common.enrollments import Enrollment, EnrollRequest
from libs.common.sequences import Sequence, SequenceCreate, Version
from services.api.deps import ProjectId, nudge_release, runtime_of, transaction


class SequencesController(Controller):
    path = "/v1/sequences"
    tags = ["sequences"]

    @post("/", sync_to_thread=True)
    def create(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[SequenceCreate]
    ) -> Sequence:
        """Create a sequence as a draft."""
        with transaction(runtime_of(request)) as conn:
            return sequences.create_sequence(conn, project_id, data)

    @get("/{sequence_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, sequence_id: FromPath[uuid.UUID]
    ) -> Sequence:
        with transaction(runtime_of(request)) as conn:
            return sequences.get_sequence(conn, project_id, sequence_id)

    @post("/{sequence_id:uuid}/publish", sync_to_thread=True)
    def publish(
        self, request: Request[Any, Any, Any], project_id: ProjectId, sequence_id: FromPath[uuid.UUID]
    ) -> Version:
        """Freeze the draft as a new immutable version; new enrollments pin it."""
        with transaction(runtime_of(request)) as conn:
            return sequences.publish_sequence(conn, project_id, sequence_id)


class EnrollmentsController(Controller):
    path = "/v1/enrollments"
    tags = ["enrollments"]

    @post("/", sync_to_thread=True)
    def enroll(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[EnrollRequest]
    ) -> Enrollment:
        """Enroll a contact in a sequence's current version."""
        runtime = runtime_of(request)
        now = runtime.clock.now()
        with transaction(runtime) as conn:
            enrollment = enrollments.enroll(conn, project_id, data, now=now)
        if enrollment.next_run_at <= now:
            nudge_release(runtime, project_id, enrollment.id)
        return enrollment

    @get("/{enrollment_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, enrollment_id: FromPath[uuid.UUID]
    ) -> Enrollment:
        with transaction(runtime_of(request)) as conn:
            return enrollments.get_enrollment(conn, project_id, enrollment_id)
