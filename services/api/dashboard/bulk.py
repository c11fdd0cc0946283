"""Bulk enrollments from a CSV upload: the job's live progress bar, cancelling it, its skipped contacts.

The CSV has one contact a row, as a phone number (E.164) or a contact id, in a column named ``phone`` or
``contact_id`` (or the first column when there is no such header). The job itself runs in the triggers
service, a chunk at a time, as ``POST /v1/bulk-enrollments`` does.
"""

from __future__ import annotations

import csv
import io
import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath

from libs.common.core.csv_export import csv_chunks
from libs.common.core.errors import FollowupsError, NotFound
from libs.common.followups import sequences
from libs.common.rules import bulk
from libs.common.rules.bulk import MAX_CONTACTS, SKIPPED_HEADER, BulkCreate
from services.api.body import MAX_BULK_BODY_BYTES
from services.api.dashboard.base import paged, project_of, query_uuid, see_other
from services.api.dashboard.forms import Form, FormErrors, error_of, key_values, validation_error
from services.api.dashboard.queries import sequence_names
from services.api.dashboard.render import SECURITY_HEADERS, page
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of

#: The job's fields named as the upload form's inputs.
BULK_FIELDS = {"contact_ids": "file", "phones": "file"}


def read_csv(raw: bytes, errors: FormErrors) -> tuple[list[str], list[str]]:
    """The contact ids and phone numbers of an uploaded CSV (see the module)."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        errors.add("file", "the file is not UTF-8 text (save the spreadsheet as CSV UTF-8)")
        return [], []
    rows = [row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]
    if not rows:
        errors.add("file", "the file has no contacts")
        return [], []
    header = [cell.strip().lower() for cell in rows[0]]
    column = next((header.index(name) for name in ("phone", "contact_id", "id") if name in header), None)
    if column is not None:
        rows = rows[1:]
    ids: list[str] = []
    phones: list[str] = []
    for row in rows:
        value = row[column or 0].strip() if len(row) > (column or 0) else ""
        if not value:
            continue
        try:
            ids.append(str(uuid.UUID(value)))
        except ValueError:
            phones.append(value)
    if not ids and not phones:
        errors.add("file", "the file has no contacts")
    elif len(ids) + len(phones) > MAX_CONTACTS:
        errors.add("file", f"a job lists at most {MAX_CONTACTS} contacts")
    return ids, phones


class BulkController(Controller):
    path = "/bulk"

    @get("/", sync_to_thread=True)
    def list(self, request: Request[Any, Any, Any]) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            rows = bulk.list_jobs(conn, project_id, limit=51, after=query_uuid(request, "after"))
            items, cursor = paged(rows)
            names = sequence_names(conn, project_id, [job.sequence_id for job in items])
        return page(
            request, "bulk/list.html", title="Bulk enrollments", jobs=items, cursor=cursor, names=names
        )

    @get("/new", sync_to_thread=True)
    def new(self, request: Request[Any, Any, Any]) -> Response[str]:
        values = {"sequence_id": request.query_params.get("sequence_id") or "", "variables": ""}
        return self._form(request, values, FormErrors())

    @post("/new", sync_to_thread=True, request_max_body_size=MAX_BULK_BODY_BYTES)
    def create(self, request: Request[Any, Any, Any]) -> Response[str]:
        form = Form.of(request)
        values = {"sequence_id": form.get("sequence_id"), "variables": form.get("variables")}
        errors = FormErrors()
        upload = form.file("file")
        variables = key_values(values["variables"], "variables", errors)
        if not values["sequence_id"]:
            errors.add("sequence_id", "choose a sequence")
        ids: list[str] = []
        phones: list[str] = []
        if upload is None or not upload.filename:
            errors.add("file", "choose a CSV file of contacts")
        else:
            ids, phones = read_csv(upload.file.read(), errors)
        if errors:
            return self._form(request, values, errors, status=422)
        runtime = runtime_of(request)
        project_id = project_of(request)
        payload = {
            "sequence_id": values["sequence_id"],
            "contact_ids": ids or None,
            "phones": phones or None,
            "variables": variables,
        }
        try:
            data = msgspec.convert(payload, BulkCreate)
            with transaction(runtime) as conn:
                job, _ = bulk.create_job(conn, project_id, data, now=runtime.clock.now())
        except msgspec.ValidationError as exc:
            return self._form(request, values, validation_error(exc).renamed(BULK_FIELDS), status=422)
        except FollowupsError as exc:
            status = status_of(exc)
            return self._form(request, values, error_of(exc).renamed(BULK_FIELDS), status=status)
        return see_other(f"/app/bulk/{job.id}", notice="created")

    def _form(
        self, request: Request[Any, Any, Any], values: dict[str, str], errors: FormErrors, status: int = 200
    ) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            found = sequences.list_sequences(
                conn, project_of(request), limit=200, after=None, status="active"
            )
        choices = [("", "choose…")] + [(str(s.id), s.name) for s in found if s.current_version_id]
        return page(
            request,
            "bulk/new.html",
            status=status,
            title="Bulk enrollment",
            values=values,
            errors=errors,
            sequence_choices=choices,
            max_contacts=MAX_CONTACTS,
        )

    @get("/{job_id:uuid}", sync_to_thread=True)
    def detail(self, request: Request[Any, Any, Any], job_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._job(request, job_id, "bulk/detail.html")

    @get("/{job_id:uuid}/progress", sync_to_thread=True)
    def progress(self, request: Request[Any, Any, Any], job_id: FromPath[uuid.UUID]) -> Response[str]:
        """The progress bar alone: what the job's page fetches every second until the job is done."""
        return self._job(request, job_id, "bulk/_progress.html")

    def _job(self, request: Request[Any, Any, Any], job_id: uuid.UUID, template: str) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            job = bulk.get_job(conn, project_id, job_id)
            names = sequence_names(conn, project_id, [job.sequence_id])
        return page(
            request,
            template,
            title="Bulk enrollment",
            job=job,
            sequence_name=names.get(job.sequence_id, ""),
            done=job.status in ("completed", "cancelled", "failed"),
        )

    @post("/{job_id:uuid}/cancel", sync_to_thread=True)
    def cancel(self, request: Request[Any, Any, Any], job_id: FromPath[uuid.UUID]) -> Response[str]:
        runtime = runtime_of(request)
        project_id = project_of(request)
        try:
            with transaction(runtime) as conn:
                bulk.cancel_job(conn, project_id, job_id, now=runtime.clock.now())
        except FollowupsError as exc:
            if isinstance(exc, NotFound):
                raise
        return see_other(f"/app/bulk/{job_id}")

    @get("/{job_id:uuid}/skipped.csv", sync_to_thread=True)
    def skipped(self, request: Request[Any, Any, Any], job_id: FromPath[uuid.UUID]) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            text = "".join(csv_chunks(SKIPPED_HEADER, bulk.skipped_rows(conn, project_id, job_id)))
        return Response(
            text,
            media_type="text/csv",
            headers={
                **SECURITY_HEADERS,
                "Content-Disposition": f'attachment; filename="skipped-{job_id}.csv"',
            },
        )
