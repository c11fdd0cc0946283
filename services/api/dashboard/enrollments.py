"""Enrollments: the list (by sequence, status, contact), an enrollment's timeline (step runs, their messages
and statuses, what it waits for, why it stopped) which refreshes itself while the enrollment runs, pause,
resume, stop with a note, and enrolling one contact."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath

from libs.common.contracts.labels import label as label_of
from libs.common.core.errors import FollowupsError, NotFound
from libs.common.followups import enrollments, sequences
from libs.common.followups.enrollments import EnrollmentDetail, EnrollRequest
from libs.common.followups.held import explain
from libs.common.platform import contacts
from services.api.dashboard.base import paged, project_of, query_uuid, see_other
from services.api.dashboard.forms import (
    Form,
    FormErrors,
    anchor_time,
    back_to_card,
    error_of,
    key_values,
    validation_error,
)
from services.api.dashboard.queries import contact_labels, sequence_names, typed_contact_id
from services.api.dashboard.render import moment, page
from services.api.dashboard.step_form import describe
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of

STATUSES = ("active", "paused", "completed", "stopped", "failed", "converted", "exited")
LIVE = ("active", "paused")
#: The enroll form's inputs by the domain's field names.
ENROLL_FIELDS = {"contact_id": "contact"}


@dataclass(frozen=True)
class TimelineEntry:
    """One line of an enrollment's timeline."""

    state: str  # done, skipped, waiting, later, stopped, info
    title: str
    when: datetime | None
    detail: str = ""
    message: Any = None


def timeline(detail: EnrollmentDetail, steps: list[Any]) -> list[TimelineEntry]:
    """What happened to an enrollment, step by step, then what comes next or why it ended."""
    enrollment = detail.enrollment
    runs = {run.step_index: run for run in detail.step_runs}
    messages = {m.step_index: m for m in detail.messages}
    entries = [
        TimelineEntry(
            "done",
            f"Enrolled ({label_of(enrollment.source, 'source')})",
            enrollment.enrolled_at,
            f"anchor {moment(enrollment.anchor_at)}" if enrollment.anchor_at else "",
        )
    ]
    live = enrollment.status in LIVE
    for index, step in enumerate(steps):
        described = describe(step)
        label = f"Step {index + 1} · {described['kind']}"
        run = runs.get(index)
        if run is not None:
            if run.outcome == "queued":
                detail_text = f"due {moment(run.due_at)}" + (
                    f" · {label_of(run.reason, 'reason', run.reason_detail)}" if run.reason else ""
                )
                entries.append(
                    TimelineEntry("done", f"{label}: queued", run.ran_at, detail_text, messages.get(index))
                )
            elif run.outcome == "branched":  # a branch, a wait or a split: the path it took
                took = label_of(run.reason or "unknown", "reason", run.reason_detail)
                entries.append(TimelineEntry("done", f"{label}: {took}", run.ran_at, ""))
            else:
                held = explain(run.reason, run.reason_values)
                entries.append(
                    TimelineEntry(
                        "skipped",
                        f"{label}: skipped",
                        run.ran_at,
                        f"reason: {label_of(run.reason or 'unknown', 'reason', run.reason_detail)}"
                        + (f" · {held}" if held else ""),
                    )
                )
        elif live and index == enrollment.step_index:
            if enrollment.status == "paused":
                entries.append(
                    TimelineEntry(
                        "waiting",
                        f"{label}: paused",
                        None,
                        f"reason: {label_of(enrollment.reason or 'manual', 'reason')}",
                    )
                )
            else:
                held = explain(enrollment.waiting_reason, enrollment.waiting_values)
                waiting = (
                    f"waiting: {label_of(enrollment.waiting_reason, 'reason')}"
                    + (f" · {held}" if held else "")
                    if enrollment.waiting_reason
                    else "scheduled"
                )
                entries.append(TimelineEntry("waiting", f"{label}: next", enrollment.next_run_at, waiting))
        elif live and index > enrollment.step_index:
            entries.append(TimelineEntry("later", f"{label}: later", None, described["text"][:80]))
    if not live:
        reason = f"reason: {label_of(enrollment.reason, 'reason')}" if enrollment.reason else ""
        note = f" · note: {enrollment.note}" if enrollment.note else ""
        if enrollment.exited_by:
            reason = f"exit: {enrollment.exited_by}"
        state = "done" if enrollment.status in ("completed", "converted") else "stopped"
        entries.append(
            TimelineEntry(state, enrollment.status.capitalize(), enrollment.finished_at, reason + note)
        )
    if enrollment.goal is not None:
        step = f"after step {enrollment.converted_step + 1}" if enrollment.converted_step is not None else ""
        entries.append(TimelineEntry("done", f"Goal met: {enrollment.goal}", enrollment.converted_at, step))
    return entries


class EnrollmentsController(Controller):
    path = "/enrollments"

    @get("/", sync_to_thread=True)
    def list(self, request: Request[Any, Any, Any]) -> Response[str]:
        project_id = project_of(request)
        sequence_id = query_uuid(request, "sequence_id")
        status = request.query_params.get("status") or None
        status = status if status in STATUSES else None
        contact_text = (request.query_params.get("contact") or "").strip()
        errors = FormErrors()
        with transaction(runtime_of(request)) as conn:
            contact_id = typed_contact_id(conn, project_id, contact_text, errors) if contact_text else None
            rows = (
                []
                if errors
                else enrollments.list_enrollments(
                    conn,
                    project_id,
                    limit=51,
                    after=query_uuid(request, "after"),
                    sequence_id=sequence_id,
                    contact_id=contact_id,
                    status=status,
                )
            )
            items, cursor = paged(rows)
            found = sequences.list_sequences(conn, project_id, limit=200, after=None, status=None)
            names = contact_labels(conn, project_id, [e.contact_id for e in items])
            seq_names = sequence_names(conn, project_id, [e.sequence_id for e in items if e.sequence_id])
        return page(
            request,
            "enrollments/list.html",
            status=422 if errors else 200,
            title="Enrollments",
            enrollments=items,
            cursor=cursor,
            names=names,
            sequence_names=seq_names,
            errors=errors,
            filters={"sequence_id": str(sequence_id or ""), "status": status or "", "contact": contact_text},
            sequence_choices=[("", "any sequence")] + [(str(s.id), s.name) for s in found],
            status_choices=[("", "any status")] + [(s, s) for s in STATUSES],
        )

    @get("/new", sync_to_thread=True)
    def new(self, request: Request[Any, Any, Any]) -> Response[str]:
        values = {
            "sequence_id": request.query_params.get("sequence_id") or "",
            "contact": request.query_params.get("contact") or "",
            "variables": "",
            "anchor_at": "",
        }
        return self._form(request, values, FormErrors())

    @post("/new", sync_to_thread=True)
    def enroll(self, request: Request[Any, Any, Any]) -> Response[str]:
        form = Form.of(request)
        values = {name: form.get(name) for name in ("sequence_id", "contact", "variables", "anchor_at")}
        project_id = project_of(request)
        runtime = runtime_of(request)
        now = runtime.clock.now()
        errors = FormErrors()
        variables = key_values(values["variables"], "variables", errors)
        anchor = anchor_time(values["anchor_at"], errors, "anchor_at")
        if not values["sequence_id"]:
            errors.add("sequence_id", "choose a sequence")
        try:
            with transaction(runtime) as conn:
                contact_id = typed_contact_id(conn, project_id, values["contact"], errors, field="contact")
                if errors:
                    return self._form(request, values, errors, status=422)
                data = msgspec.convert(
                    {
                        "contact_id": str(contact_id),
                        "sequence_id": values["sequence_id"],
                        "variables": variables,
                        "anchor_at": anchor.isoformat() if anchor else None,
                    },
                    EnrollRequest,
                )
                enrollment, _ = enrollments.enroll(conn, project_id, data, now=now, source="dashboard")
        except msgspec.ValidationError as exc:
            return self._form(request, values, validation_error(exc).renamed(ENROLL_FIELDS), status=422)
        except FollowupsError as exc:
            return self._form(request, values, error_of(exc).renamed(ENROLL_FIELDS), status=status_of(exc))
        return see_other(f"/app/enrollments/{enrollment.id}", notice="enrolled")

    def _form(
        self, request: Request[Any, Any, Any], values: dict[str, str], errors: FormErrors, status: int = 200
    ) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            found = sequences.list_sequences(conn, project_of(request), limit=200, after=None, status=None)
        choices = [("", "choose…")] + [
            (str(s.id), s.name) for s in found if s.current_version_id and s.status != "archived"
        ]
        return page(
            request,
            "enrollments/new.html",
            status=status,
            title="Enroll a contact",
            values=values,
            errors=errors,
            sequence_choices=choices,
        )

    @get("/{enrollment_id:uuid}", sync_to_thread=True)
    def detail(self, request: Request[Any, Any, Any], enrollment_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._detail(request, enrollment_id, "enrollments/detail.html")

    @get("/{enrollment_id:uuid}/timeline", sync_to_thread=True)
    def timeline_fragment(
        self, request: Request[Any, Any, Any], enrollment_id: FromPath[uuid.UUID]
    ) -> Response[str]:
        """The timeline alone: what the detail page fetches every few seconds while the enrollment runs."""
        return self._detail(request, enrollment_id, "enrollments/_timeline.html")

    def _detail(
        self,
        request: Request[Any, Any, Any],
        enrollment_id: uuid.UUID,
        template: str,
        *,
        errors: FormErrors | None = None,
        status: int = 200,
        note: str = "",
    ) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            detail = enrollments.get_enrollment_detail(conn, project_id, enrollment_id)
            enrollment = detail.enrollment
            steps = sequences.version_definition(conn, project_id, enrollment.version_id).steps
            contact = contacts.get_contact(conn, project_id, enrollment.contact_id)
            names = sequence_names(
                conn, project_id, [enrollment.sequence_id] if enrollment.sequence_id else []
            )
        return page(
            request,
            template,
            status=status,
            title="Enrollment",
            enrollment=enrollment,
            contact=contact,
            sequence_name=names.get(enrollment.sequence_id, "one-off follow-up")
            if enrollment.sequence_id
            else "one-off follow-up",
            entries=timeline(detail, steps),
            live=enrollment.status in LIVE,
            errors=errors or FormErrors(),
            note=note,
        )

    @post("/{enrollment_id:uuid}/pause", sync_to_thread=True)
    def pause(self, request: Request[Any, Any, Any], enrollment_id: FromPath[uuid.UUID]) -> Response[str]:
        runtime = runtime_of(request)
        try:
            with transaction(runtime) as conn:
                enrollments.pause_enrollment(
                    conn, project_of(request), enrollment_id, now=runtime.clock.now()
                )
        except FollowupsError as exc:
            return self._refused(request, enrollment_id, exc)
        return see_other(_back(request, enrollment_id), notice="paused")

    @post("/{enrollment_id:uuid}/resume", sync_to_thread=True)
    def resume(self, request: Request[Any, Any, Any], enrollment_id: FromPath[uuid.UUID]) -> Response[str]:
        runtime = runtime_of(request)
        project_id = project_of(request)
        now = runtime.clock.now()
        try:
            with transaction(runtime) as conn:
                enrollments.resume_enrollment(conn, project_id, enrollment_id, now=now)
        except FollowupsError as exc:
            return self._refused(request, enrollment_id, exc)
        return see_other(_back(request, enrollment_id), notice="resumed")

    @post("/{enrollment_id:uuid}/stop", sync_to_thread=True)
    def stop(self, request: Request[Any, Any, Any], enrollment_id: FromPath[uuid.UUID]) -> Response[str]:
        runtime = runtime_of(request)
        note = Form.of(request).get("note").strip() or None
        try:
            with transaction(runtime) as conn:
                enrollments.stop_enrollment(
                    conn, project_of(request), enrollment_id, note=note, now=runtime.clock.now()
                )
        except FollowupsError as exc:
            return self._refused(request, enrollment_id, exc, note=note or "")
        return see_other(_back(request, enrollment_id), notice="stopped")

    def _refused(
        self, request: Request[Any, Any, Any], enrollment_id: uuid.UUID, exc: FollowupsError, note: str = ""
    ) -> Response[str]:
        if isinstance(exc, NotFound):
            raise exc
        return self._detail(
            request,
            enrollment_id,
            "enrollments/detail.html",
            errors=error_of(exc),
            status=status_of(exc),
            note=note,
        )


def _back(request: Request[Any, Any, Any], enrollment_id: uuid.UUID) -> str:
    """Where an action returns: the contact card it was pressed on, else the enrollment."""
    return back_to_card(request, f"/app/enrollments/{enrollment_id}")
