"""Contacts: create, upsert by E.164 phone number, read, update attributes, tags and time zone; lock one
for a change, opt out and in, erase.

An erased contact is gone for good: every read and change here answers as for an unknown contact (404),
and lists leave it out; only its anonymised row stays, for the references to it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from psycopg import Connection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from libs.common.contracts.events import ContactErased
from libs.common.contracts.limits import KEY_BOUNDS, MAX_ATTRIBUTES, MAX_LABELS, Name, Phone, Tag, Timezone
from libs.common.core import validation
from libs.common.core.db import map_errors
from libs.common.core.errors import AlreadyExists, InvalidInput, NotFound
from libs.common.core.outbox import write_events
from libs.common.core.sql import load_queries

QUERIES = load_queries("libs.common.platform", "contacts.sql")

#: Most tags one contact carries.
MAX_TAGS = MAX_LABELS

#: A contact's attributes: at most 100 (their keys, 1 to 64 characters, and 16 KB as JSON: checked on
#: write, naming the key).
Attributes = Annotated[
    dict[str, Any],
    msgspec.Meta(max_length=MAX_ATTRIBUTES, extra_json_schema={"propertyNames": KEY_BOUNDS}),
]
#: A contact's tags: at most 100 (each, 1 to 64 characters of letters, digits and ``_-./:``: checked on
#: write, naming ``tags``).
Tags = Annotated[list[Tag], msgspec.Meta(max_length=MAX_TAGS)]


class _Input(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ContactFields(_Input):
    """A contact's fields other than its phone number (the body of an upsert by phone)."""

    name: Name | None = None
    timezone: Timezone | None = None
    attributes: Attributes = msgspec.field(default_factory=dict)
    tags: Tags = msgspec.field(default_factory=list)


class ContactCreate(ContactFields, kw_only=True):
    phone: Phone


class ContactUpdate(_Input):
    """A partial update: absent fields are kept; an attribute set to null is removed."""

    name: Name | msgspec.UnsetType | None = msgspec.UNSET
    timezone: Timezone | msgspec.UnsetType | None = msgspec.UNSET
    attributes: Attributes | msgspec.UnsetType = msgspec.UNSET


class TagsChange(_Input):
    tags: Tags


class Contact(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    phone: str | None
    name: str | None
    timezone: str | None
    attributes: dict[str, Any]
    tags: list[str]
    opted_out_at: datetime | None
    #: When the provider said the phone cannot receive (131026, ...): the contact's follow-ups stopped then.
    undeliverable_at: datetime | None = None
    consent: str
    created_at: datetime
    updated_at: datetime


_CONSTRAINTS = {
    "contacts_project_phone_key": lambda: AlreadyExists("a contact with this phone exists", field="phone")
}


def _tags(values: list[str]) -> list[str]:
    cleaned = sorted({validation.tag(v) for v in values})
    if len(cleaned) > MAX_TAGS:
        raise InvalidInput(f"a contact carries at most {MAX_TAGS} tags", field="tags")
    return cleaned


def _attributes(values: dict[str, Any]) -> dict[str, Any]:
    if len(values) > MAX_ATTRIBUTES:
        raise InvalidInput(f"a contact carries at most {MAX_ATTRIBUTES} attributes", field="attributes")
    for key in values:
        if not 1 <= len(key) <= 64:
            raise InvalidInput("attribute names are 1 to 64 characters", field=f"attributes.{key}")
    validation.json_value(values, "attributes")
    return values


def _validated(phone: str, data: ContactFields) -> dict[str, Any]:
    return {
        "phone": validation.phone(phone),
        "name": validation.name(data.name) if data.name is not None else None,
        "timezone": validation.timezone(data.timezone) if data.timezone is not None else None,
        "attributes": Jsonb(_attributes(data.attributes)),
        "tags": _tags(data.tags),
    }


def create_contact(conn: Connection[Any], project_id: uuid.UUID, data: ContactCreate) -> Contact:
    params = _validated(data.phone, data) | {"project_id": project_id}
    with map_errors(_CONSTRAINTS), conn.cursor(row_factory=class_row(Contact)) as cur:
        contact = cur.execute(QUERIES["insert_contact"], params).fetchone()
    assert contact is not None
    return contact


def upsert_contact(
    conn: Connection[Any], project_id: uuid.UUID, phone: str, data: ContactFields
) -> tuple[Contact, bool]:
    """Create the contact with this phone, or update the given fields of the existing one.

    Returns the contact and whether it was created. Attributes are merged; tags are added.
    """
    params = _validated(phone, data) | {"project_id": project_id}
    with conn.cursor() as cur:
        row = cur.execute(QUERIES["upsert_contact"], params).fetchone()
    assert row is not None
    contact_id, created = row
    return get_contact(conn, project_id, contact_id), created


def get_contact(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID) -> Contact:
    """One contact of the project; 404 for another project's contact, an unknown or an erased one."""
    with conn.cursor(row_factory=class_row(Contact)) as cur:
        contact = cur.execute(QUERIES["get_contact"], {"project_id": project_id, "id": contact_id}).fetchone()
    if contact is None:
        raise NotFound("contact not found", field="contact_id")
    return contact


def contact_by_phone(conn: Connection[Any], project_id: uuid.UUID, phone: str) -> Contact | None:
    """The contact with this E.164 phone, locked, or None."""
    with conn.cursor(row_factory=class_row(Contact)) as cur:
        return cur.execute(QUERIES["contact_by_phone"], {"project_id": project_id, "phone": phone}).fetchone()


def list_contacts(
    conn: Connection[Any],
    project_id: uuid.UUID,
    *,
    limit: int,
    after: uuid.UUID | None = None,
    tag: str | None = None,
    phone: str | None = None,
) -> list[Contact]:
    """Contacts in id order, after the cursor ``after``, optionally with a tag or a phone (never an erased
    one)."""
    params = {
        "project_id": project_id,
        "limit": limit,
        "after": after,
        "tag": validation.tag(tag, field="tag") if tag is not None else None,
        "phone": validation.phone(phone) if phone else None,
    }
    with conn.cursor(row_factory=class_row(Contact)) as cur:
        return cur.execute(QUERIES["list_contacts"], params).fetchall()


def update_contact(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, data: ContactUpdate
) -> Contact:
    attributes = None if data.attributes is msgspec.UNSET else _attributes(data.attributes)
    params = {
        "project_id": project_id,
        "id": contact_id,
        "set_name": data.name is not msgspec.UNSET,
        "name": validation.name(data.name) if isinstance(data.name, str) else None,
        "set_timezone": data.timezone is not msgspec.UNSET,
        "timezone": validation.timezone(data.timezone) if isinstance(data.timezone, str) else None,
        "set_attributes": attributes is not None,
        "attributes": Jsonb({k: v for k, v in (attributes or {}).items() if v is not None}),
        "removed_attributes": [k for k, v in (attributes or {}).items() if v is None],
    }
    with conn.cursor(row_factory=class_row(Contact)) as cur:
        contact = cur.execute(QUERIES["update_contact"], params).fetchone()
    if contact is None:
        raise NotFound("contact not found", field="contact_id")
    return contact


def add_tags(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, tags: list[str]) -> Contact:
    return send_tags_change(conn, "add", project_id, contact_id, tags)()


def remove_tags(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, tags: list[str]
) -> Contact:
    return send_tags_change(conn, "remove", project_id, contact_id, tags)()


def send_tags_change(
    conn: Connection[Any],
    change: Literal["add", "remove"],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    tags: list[str],
) -> Callable[[], Contact]:
    """Send the change of a contact's tags; the call returned reads the contact as changed (404 for another
    project's contact or an erased one). In a pipeline, the statement goes out with the ones after it, and is
    read only when that call is made (:func:`libs.common.rules.actions.run_actions`)."""
    checked = _tags(tags) if change == "add" else [validation.tag(t) for t in tags]
    params = {"project_id": project_id, "id": contact_id, "tags": checked}
    cur = conn.cursor(row_factory=class_row(Contact))
    cur.execute(QUERIES[f"{change}_tags"], params)

    def changed() -> Contact:
        with cur:
            contact = cur.fetchone()
        if contact is None:
            raise NotFound("contact not found", field="contact_id")
        return contact

    return changed


def lock_contact(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID) -> None:
    """Lock a contact for a change whose stop paths follow (FOR NO KEY UPDATE: the releaser's share lock
    skips it); 404 for another project's contact or an erased one."""
    _lock(conn, "lock_contact", project_id, contact_id)


def lock_contact_for_erasure(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID) -> None:
    """Lock a contact to erase it (FOR UPDATE: erasure clears a key column); 404 as :func:`lock_contact`."""
    _lock(conn, "lock_contact_for_erasure", project_id, contact_id)


def share_reachable(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, since: datetime
) -> bool:
    """Whether a message may still go to the contact: not opted out, erased or flagged undeliverable, and
    silent since ``since``; share-locked, so a stop path in flight (a reply, an opt-out) is waited for and
    seen, and none starts before this transaction ends."""
    params = {"project_id": project_id, "id": contact_id, "since": since}
    return conn.execute(QUERIES["share_reachable"], params).fetchone() is not None


def share_contact(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID) -> bool:
    """Key-share lock a contact about to be written to; False when it was erased."""
    params = {"project_id": project_id, "id": contact_id}
    return conn.execute(QUERIES["share_contact"], params).fetchone() is not None


def _lock(conn: Connection[Any], query: str, project_id: uuid.UUID, contact_id: uuid.UUID) -> None:
    if conn.execute(QUERIES[query], {"project_id": project_id, "id": contact_id}).fetchone() is None:
        raise NotFound("contact not found", field="contact_id")


def opt_out(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, now: datetime) -> bool:
    """Record an opt-out (consent revoked); False when the contact had already opted out."""
    params = {"project_id": project_id, "id": contact_id, "now": now}
    return conn.execute(QUERIES["opt_out"], params).fetchone() is not None


def opt_in(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, now: datetime) -> bool:
    """Record an opt-in (consent granted); False when nothing changed."""
    params = {"project_id": project_id, "id": contact_id, "now": now}
    return conn.execute(QUERIES["opt_in"], params).fetchone() is not None


def flag_undeliverable(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, now: datetime
) -> bool:
    """Flag the contact undeliverable (the provider said so); False when it already was."""
    params = {"project_id": project_id, "id": contact_id, "now": now}
    return conn.execute(QUERIES["flag_undeliverable"], params).fetchone() is not None


def limit_marketing(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, until: datetime
) -> None:
    """The contact's marketing follow-ups wait until ``until`` (the provider's per-user marketing limit)."""
    conn.execute(QUERIES["limit_marketing"], {"project_id": project_id, "id": contact_id, "until": until})


def erase_contact(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, *, now: datetime
) -> None:
    """Privacy erasure, the platform's part (the caller locked the contact for erasure): messages and
    activities deleted, the contact anonymised, conversations cleared, and a ``contact.erased`` event (the
    ``message.claimed`` events are the outbox's part: :func:`libs.common.core.outbox.erase_contact`)."""
    conn.execute(QUERIES["erase_contact"], {"project_id": project_id, "id": contact_id, "now": now})
    write_events(conn, project_id, [ContactErased(contact_id=contact_id)], occurred_at=now)


def contact_names(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]
) -> list[tuple[uuid.UUID, str | None, str | None]]:
    """The id, name and phone of each of the project's contacts in ``ids`` (None, None for an erased one),
    in one query (a list's rows)."""
    rows = conn.execute(QUERIES["contact_names"], {"project_id": project_id, "ids": list(set(ids))})
    return [(row[0], row[1], row[2]) for row in rows]
