"""Contacts: the list, a new contact, and the contact card (its conversation: every message in and out
with its status and what sent it, newest first and paged; its live follow-ups with stop buttons, its
pending rule executions, opt-out state and consent; its tags, attributes, opt-out and consent edited
through the API's own functions)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath

from libs.common.contracts.platform_events import ContactOptedIn, ContactOptedOut, PlatformEvent
from libs.common.core.errors import FollowupsError, InvalidInput, NotFound
from libs.common.followups import enrollments
from libs.common.ingress import contact_changes, handle_event
from libs.common.platform import contacts, messages
from libs.common.platform.contacts import ContactCreate, ContactUpdate, TagsChange
from libs.common.rules import executions
from services.api.dashboard.base import paged, project_of, query_uuid, see_other
from services.api.dashboard.forms import Form, FormErrors, comma_list, error_of, key_values, validation_error
from services.api.dashboard.queries import campaign_labels, rule_labels, sequence_names
from services.api.dashboard.render import page
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of

#: Messages a page of the contact card's conversation shows.
MESSAGES_A_PAGE = 25


class ContactsController(Controller):
    path = "/contacts"

    @get("/", sync_to_thread=True)
    def list(self, request: Request[Any, Any, Any]) -> Response[str]:
        return self._list(request, FormErrors(), {"phone": "", "name": "", "timezone": "", "tags": ""})

    def _list(
        self, request: Request[Any, Any, Any], errors: FormErrors, values: dict[str, str], status: int = 200
    ) -> Response[str]:
        project_id = project_of(request)
        search = (request.query_params.get("q") or "").strip()
        search_errors = FormErrors()
        with transaction(runtime_of(request)) as conn:
            try:
                rows = contacts.list_contacts(
                    conn, project_id, limit=51, after=query_uuid(request, "after"), phone=search or None
                )
            except InvalidInput:
                rows = []
                search_errors.add("q", "search by an E.164 phone number, such as +14155550123")
            items, cursor = paged(rows)
        return page(
            request,
            "contacts/list.html",
            status=status,
            title="Contacts",
            contacts=items,
            cursor=cursor,
            search=search,
            search_errors=search_errors,
            errors=errors,
            values=values,
        )

    @post("/new", sync_to_thread=True)
    def create(self, request: Request[Any, Any, Any]) -> Response[str]:
        form = Form.of(request)
        values = {name: form.get(name) for name in ("phone", "name", "timezone", "tags")}
        payload = {
            "phone": values["phone"],
            "name": values["name"].strip() or None,
            "timezone": values["timezone"].strip() or None,
            "tags": comma_list(values["tags"]),
        }
        runtime = runtime_of(request)
        project_id = project_of(request)
        try:
            data = msgspec.convert(payload, ContactCreate)
            with transaction(runtime) as conn:
                contact = contact_changes.create_contact(conn, project_id, data, now=runtime.clock.now())
        except msgspec.ValidationError as exc:
            return self._list(request, validation_error(exc), values, 422)
        except FollowupsError as exc:
            return self._list(request, error_of(exc), values, status_of(exc))
        return see_other(f"/app/contacts/{contact.id}", notice="created")

    @get("/{contact_id:uuid}", sync_to_thread=True)
    def card(self, request: Request[Any, Any, Any], contact_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._card(request, contact_id, FormErrors(), {})

    # --- the card's edits: the API's own functions (tags and attributes as PATCH and POST .../tags, opt-out
    # and consent as the platform events contact.opted_out / contact.opted_in) --------------------------

    @post("/{contact_id:uuid}/tags", sync_to_thread=True)
    def add_tags(self, request: Request[Any, Any, Any], contact_id: FromPath[uuid.UUID]) -> Response[str]:
        raw = Form.of(request).get("tags")
        return self._change(
            request,
            contact_id,
            {"tags": raw},
            lambda conn, now: self._tags(conn, request, contact_id, raw, now),
        )

    @post("/{contact_id:uuid}/tags/remove", sync_to_thread=True)
    def remove_tag(self, request: Request[Any, Any, Any], contact_id: FromPath[uuid.UUID]) -> Response[str]:
        tag = Form.of(request).get("tag")

        def remove(conn: Any, now: Any) -> None:
            contact_changes.change_tags(conn, project_of(request), contact_id, remove=[tag], now=now)

        return self._change(request, contact_id, {}, remove)

    @post("/{contact_id:uuid}/attributes", sync_to_thread=True)
    def set_attributes(
        self, request: Request[Any, Any, Any], contact_id: FromPath[uuid.UUID]
    ) -> Response[str]:
        form = Form.of(request)
        raw, removed = form.get("attributes"), form.get("remove")
        errors = FormErrors()
        changes: dict[str, Any] = {
            key: _typed(value) for key, value in key_values(raw, "attributes", errors).items()
        }
        if removed:
            changes[removed] = None  # an attribute set to null is removed, as PATCH /v1/contacts/{id} does
        if errors:
            return self._card(request, contact_id, errors, {"attributes": raw}, status=422)

        def update(conn: Any, now: Any) -> None:
            data = msgspec.convert({"attributes": changes}, ContactUpdate)
            contact_changes.update_contact(conn, project_of(request), contact_id, data, now=now)

        return self._change(request, contact_id, {"attributes": raw}, update)

    @post("/{contact_id:uuid}/opt-out", sync_to_thread=True)
    def opt_out(self, request: Request[Any, Any, Any], contact_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._event(request, contact_id, ContactOptedOut(contact_id=contact_id))

    @post("/{contact_id:uuid}/opt-in", sync_to_thread=True)
    def opt_in(self, request: Request[Any, Any, Any], contact_id: FromPath[uuid.UUID]) -> Response[str]:
        return self._event(request, contact_id, ContactOptedIn(contact_id=contact_id))

    def _tags(
        self, conn: Any, request: Request[Any, Any, Any], contact_id: uuid.UUID, raw: str, now: Any
    ) -> None:
        data = msgspec.convert({"tags": comma_list(raw)}, TagsChange)
        contact_changes.change_tags(conn, project_of(request), contact_id, add=data.tags, now=now)

    def _change(
        self,
        request: Request[Any, Any, Any],
        contact_id: uuid.UUID,
        values: dict[str, str],
        change: Callable[[Any, Any], None],
    ) -> Response[str]:
        """Run one edit in a transaction; its errors are shown next to the card's field they name."""
        runtime = runtime_of(request)
        try:
            with transaction(runtime) as conn:
                change(conn, runtime.clock.now())
        except msgspec.ValidationError as exc:
            return self._card(request, contact_id, validation_error(exc), values, status=422)
        except FollowupsError as exc:
            if isinstance(exc, NotFound):
                raise
            return self._card(request, contact_id, error_of(exc), values, status=status_of(exc))
        return see_other(f"/app/contacts/{contact_id}", notice="saved")

    def _event(
        self, request: Request[Any, Any, Any], contact_id: uuid.UUID, event: PlatformEvent
    ) -> Response[str]:
        """An opt-out or an opt-in, applied as ``POST /v1/events`` applies it (its stop path included)."""
        runtime = runtime_of(request)
        handle_event(runtime, project_of(request), event, now=runtime.clock.now())
        return see_other(f"/app/contacts/{contact_id}", notice="saved")

    def _card(
        self,
        request: Request[Any, Any, Any],
        contact_id: uuid.UUID,
        errors: FormErrors,
        values: dict[str, str],
        status: int = 200,
    ) -> Response[str]:
        project_id = project_of(request)
        with transaction(runtime_of(request)) as conn:
            contact = contacts.get_contact(conn, project_id, contact_id)
            found = enrollments.list_enrollments(conn, project_id, limit=100, contact_id=contact_id)
            pending = executions.pending_for_contact(conn, project_id, contact_id)
            rows = messages.list_messages(
                conn,
                project_id,
                messages.MessageFilters(contact_id=contact_id),
                limit=MESSAGES_A_PAGE + 1,
                after=query_uuid(request, "messages_after"),
            )
            conversation, messages_cursor = paged(rows, MESSAGES_A_PAGE)
            sequence_ids = [e.sequence_id for e in found if e.sequence_id]
            sequence_ids += [m.origin.sequence_id for m in conversation if m.origin.sequence_id]
            names = sequence_names(conn, project_id, sequence_ids)
            rule_names = rule_labels(
                conn, project_id, [m.origin.rule_id for m in conversation if m.origin.rule_id]
            )
            campaign_names = campaign_labels(
                conn, project_id, [m.origin.campaign_id for m in conversation if m.origin.campaign_id]
            )
        live = [e for e in found if e.status in ("active", "paused")]
        finished = [e for e in found if e.status not in ("active", "paused")]
        return page(
            request,
            "contacts/card.html",
            status=status,
            title=contact.name or contact.phone or "Contact",
            contact=contact,
            live=live,
            finished=finished[:20],
            pending=pending,
            sequence_names=names,
            conversation=conversation,
            messages_cursor=messages_cursor,
            rule_names=rule_names,
            campaign_names=campaign_names,
            errors=errors,
            values=values,
        )


def _typed(value: str) -> Any:
    """An attribute typed as a condition compares it: a number or ``true`` / ``false`` as such, else text."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, bool | int | float) else value
