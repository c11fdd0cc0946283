"""Bulk enrollments (a list of contacts or a frozen segment, enrolled by a resumable job) and campaigns
(each released recipient enters the campaign's no-reply sequence)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from litestar import Controller, Request, Response, get, post, put
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.response import Stream

from libs.common.core.csv_export import csv_chunks
from libs.common.followups import campaigns
from libs.common.followups.campaigns import Campaign, CampaignPut
from libs.common.rules import bulk
from libs.common.rules.bulk import SKIPPED_HEADER, BulkCreate, BulkJob
from services.api.body import MAX_BULK_BODY_BYTES
from services.api.deps import PageLimit, ProjectId, page, runtime_of, transaction
from services.api.openapi import conflict, not_found
from services.api.routes import Page, as_page

#: A sequence the body names that is not one of the project's.
_UNKNOWN_SEQUENCE = not_found("The sequence is not one of the project's.")


class BulkEnrollmentsController(Controller):
    path = "/v1/bulk-enrollments"
    tags = ["bulk enrollments"]
    #: Up to 100,000 contact ids or phone numbers.
    request_max_body_size = MAX_BULK_BODY_BYTES

    @post(
        "/",
        sync_to_thread=True,
        status_code=202,
        responses={200: ResponseSpec(BulkJob, description="The job this `Idempotency-Key` created before.")}
        | _UNKNOWN_SEQUENCE
        | conflict("The sequence cannot take enrollments (not published and active)."),
    )
    def create(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[BulkCreate]
    ) -> Response[BulkJob]:
        """Enroll a list of contacts (``contact_ids`` and/or ``phones``, up to 100,000) or the contacts a
        ``segment`` matches now in a sequence. 202 with the queued job; with an ``Idempotency-Key`` header,
        a retry returns the same job (200)."""
        runtime = runtime_of(request)
        key = request.headers.get("idempotency-key")
        with transaction(runtime) as conn:
            job, created = bulk.create_job(
                conn, project_id, data, idempotency_key=key, now=runtime.clock.now()
            )
        return Response(job, status_code=202 if created else 200)

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
    ) -> Page[BulkJob]:
        with transaction(runtime_of(request)) as conn:
            rows = bulk.list_jobs(conn, project_id, limit=limit + 1, after=after)
        return as_page(page(rows, limit))

    @get("/{job_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, job_id: FromPath[uuid.UUID]
    ) -> BulkJob:
        """Progress: status (queued, running, completed, cancelled, failed), total, processed, enrolled, and
        skipped contacts by reason."""
        with transaction(runtime_of(request)) as conn:
            return bulk.get_job(conn, project_id, job_id)

    @post("/{job_id:uuid}/cancel", sync_to_thread=True, status_code=200)
    def cancel(
        self, request: Request[Any, Any, Any], project_id: ProjectId, job_id: FromPath[uuid.UUID]
    ) -> BulkJob:
        """Stop the job at its next chunk (contacts already enrolled stay enrolled)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            job = bulk.cancel_job(conn, project_id, job_id, now=runtime.clock.now())
        return job

    @get("/{job_id:uuid}/skipped", sync_to_thread=True, media_type="text/csv")
    def skipped(
        self, request: Request[Any, Any, Any], project_id: ProjectId, job_id: FromPath[uuid.UUID]
    ) -> Stream:
        """The skipped contacts with their reason, as CSV: position, contact_id, phone, reason."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            bulk.get_job(conn, project_id, job_id)  # 404 before the stream starts

        def lines() -> Iterator[str]:
            with transaction(runtime) as conn:
                yield from csv_chunks(SKIPPED_HEADER, bulk.skipped_rows(conn, project_id, job_id))

        return Stream(
            lines(),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="bulk-{job_id}-skipped.csv"'},
        )


class CampaignsController(Controller):
    path = "/v1/campaigns"
    tags = ["bulk enrollments"]

    @put("/{campaign_id:uuid}", sync_to_thread=True, responses=_UNKNOWN_SEQUENCE)
    def put(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        campaign_id: FromPath[uuid.UUID],
        data: JSONBody[CampaignPut],
    ) -> Campaign:
        """Set the campaign's no-reply sequence: each recipient released (``campaign.recipient_released``)
        is enrolled in it, once."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            return campaigns.put_campaign(conn, project_id, campaign_id, data, now=runtime.clock.now())

    @get("/{campaign_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, campaign_id: FromPath[uuid.UUID]
    ) -> Campaign:
        with transaction(runtime_of(request)) as conn:
            return campaigns.get_campaign(conn, project_id, campaign_id)
