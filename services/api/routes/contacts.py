"""Contacts: create, upsert by phone, read, list, update attributes, tags."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, patch, post, put
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody, Parameter, QueryParameter

from libs.common.contracts.limits import MAX_LABEL_LENGTH, PHONE_PATTERN, TAG_PATTERN
from libs.common.core import validation
from libs.common.ingress import contact_changes
from libs.common.platform import contacts
from libs.common.platform.contacts import Contact, ContactCreate, ContactFields, ContactUpdate, TagsChange
from services.api.deps import PageLimit, ProjectId, page, query_phone, runtime_of, transaction
from services.api.openapi import conflict
from services.api.routes import Page, as_page


class ContactsController(Controller):
    path = "/v1/contacts"
    tags = ["contacts"]

    @post("/", sync_to_thread=True, responses=conflict("a contact with this phone number exists"))
    def create(
        self, request: Request[Any, Any, Any], project_id: ProjectId, data: JSONBody[ContactCreate]
    ) -> Contact:
        """Create a contact (409 if the phone number is taken)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            contact = contact_changes.create_contact(conn, project_id, data, now=runtime.clock.now())
        return contact

    @put(
        "/by-phone/{phone:str}",
        sync_to_thread=True,
        responses={201: ResponseSpec(Contact, description="The contact was created.")},
    )
    def upsert(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        phone: Annotated[str, Parameter(schema_extra={"pattern": PHONE_PATTERN})],
        data: JSONBody[ContactFields],
    ) -> Response[Contact]:
        """Create or update the contact with this E.164 phone number (201 created, 200 updated)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            contact, created = contact_changes.upsert_contact(
                conn, project_id, phone, data, now=runtime.clock.now()
            )
        return Response(contact, status_code=201 if created else 200)

    @get("/", sync_to_thread=True)
    def list(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        limit: PageLimit = 50,
        after: FromQuery[uuid.UUID | None] = None,
        tag: Annotated[
            str | None,
            QueryParameter(min_length=1, max_length=MAX_LABEL_LENGTH, schema_extra={"pattern": TAG_PATTERN}),
        ] = None,
        phone: Annotated[
            str | None, QueryParameter(min_length=1, max_length=32, schema_extra={"pattern": PHONE_PATTERN})
        ] = None,
    ) -> Page[Contact]:
        """A page of contacts; pass the returned ``next`` as ``after`` for the next page. ``phone`` finds the
        contact with that number (a literal ``+`` works as well as ``%2B``)."""
        with transaction(runtime_of(request)) as conn:
            rows = contacts.list_contacts(
                conn, project_id, limit=limit + 1, after=after, tag=tag, phone=query_phone(phone)
            )
        return as_page(page(rows, limit))

    @get("/{contact_id:uuid}", sync_to_thread=True)
    def read(
        self, request: Request[Any, Any, Any], project_id: ProjectId, contact_id: FromPath[uuid.UUID]
    ) -> Contact:
        with transaction(runtime_of(request)) as conn:
            return contacts.get_contact(conn, project_id, contact_id)

    @patch("/{contact_id:uuid}", sync_to_thread=True)
    def update(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        contact_id: FromPath[uuid.UUID],
        data: JSONBody[ContactUpdate],
    ) -> Contact:
        """Change name or time zone; merge attributes (an attribute set to null is removed)."""
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            contact = contact_changes.update_contact(
                conn, project_id, contact_id, data, now=runtime.clock.now()
            )
        return contact

    @post("/{contact_id:uuid}/tags", sync_to_thread=True, status_code=200)
    def add_tags(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        contact_id: FromPath[uuid.UUID],
        data: JSONBody[TagsChange],
    ) -> Contact:
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            contact = contact_changes.change_tags(
                conn, project_id, contact_id, add=data.tags, now=runtime.clock.now()
            )
        return contact

    # a ``path`` parameter, so that a tag with a slash (sent as %2F, which ASGI decodes) is matched too
    @delete("/{contact_id:uuid}/tags/{tag:path}", sync_to_thread=True, status_code=200)
    def remove_tag(
        self,
        request: Request[Any, Any, Any],
        project_id: ProjectId,
        contact_id: FromPath[uuid.UUID],
        tag: Annotated[str, Parameter(schema_extra={"pattern": TAG_PATTERN})],
    ) -> Contact:
        tag = validation.tag(tag.removeprefix("/"), field="tag")  # a path parameter starts with "/"
        runtime = runtime_of(request)
        with transaction(runtime) as conn:
            contact = contact_changes.change_tags(
                conn, project_id, contact_id, remove=[tag], now=runtime.clock.now()
            )
        return contact
