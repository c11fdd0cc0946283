"""Contact changes made through the API (``/v1/contacts``): the platform change, then the rule events it
makes (``contact.created``; ``contact.tag_added`` / ``tag_removed`` once per change, with every tag it
added and removed; ``contact.updated`` with what changed), in the caller's transaction, as the platform
events of :mod:`libs.common.ingress` do."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.core import validation
from libs.common.ingress.apply import record
from libs.common.platform import contacts
from libs.common.platform.contacts import Contact, ContactCreate, ContactFields, ContactUpdate


def create_contact(
    conn: Connection[Any], project_id: uuid.UUID, data: ContactCreate, *, now: datetime
) -> Contact:
    """Create a contact (``contact.created``)."""
    contact = contacts.create_contact(conn, project_id, data)
    record(conn, project_id, "contact.created", None, now, contact_id=contact.id)
    return contact


def upsert_contact(
    conn: Connection[Any], project_id: uuid.UUID, phone: str, data: ContactFields, *, now: datetime
) -> tuple[Contact, bool]:
    """Create or update the contact with this phone (``contact.created``, or what the update changed)."""
    before = contacts.contact_by_phone(conn, project_id, validation.phone(phone))
    contact, created = contacts.upsert_contact(conn, project_id, phone, data)
    if created or before is None:
        record(conn, project_id, "contact.created", None, now, contact_id=contact.id)
    else:
        _contact_changed(conn, project_id, before, contact, now)
    return contact, created


def update_contact(
    conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID, data: ContactUpdate, *, now: datetime
) -> Contact:
    """Change a contact's name, time zone or attributes (``contact.updated`` with what changed)."""
    before = _locked_contact(conn, project_id, contact_id)
    contact = contacts.update_contact(conn, project_id, contact_id, data)
    _contact_changed(conn, project_id, before, contact, now)
    return contact


def change_tags(
    conn: Connection[Any],
    project_id: uuid.UUID,
    contact_id: uuid.UUID,
    *,
    add: list[str] | None = None,
    remove: list[str] | None = None,
    now: datetime,
) -> Contact:
    """Add or remove tags (``contact.tag_added`` / ``contact.tag_removed``, once each for the change)."""
    before = _locked_contact(conn, project_id, contact_id)
    contact = before
    if add:
        contact = contacts.add_tags(conn, project_id, contact_id, add)
    if remove:
        contact = contacts.remove_tags(conn, project_id, contact_id, remove)
    _contact_changed(conn, project_id, before, contact, now)
    return contact


def _locked_contact(conn: Connection[Any], project_id: uuid.UUID, contact_id: uuid.UUID) -> Contact:
    contacts.lock_contact(conn, project_id, contact_id)
    return contacts.get_contact(conn, project_id, contact_id)


def _contact_changed(
    conn: Connection[Any], project_id: uuid.UUID, before: Contact, after: Contact, now: datetime
) -> None:
    """The rule events of a contact change: ``contact.tag_added`` once when it added tags and
    ``contact.tag_removed`` once when it removed some (each with ``tags_added`` and ``tags_removed``: a
    rule runs once for the change and tests what it added), and ``contact.updated`` for the fields and
    attributes that changed."""
    added = sorted(set(after.tags) - set(before.tags))
    removed = sorted(set(before.tags) - set(after.tags))
    tags: dict[str, Any] = {
        "changed": {"contact.tags": {"from": before.tags, "to": after.tags}},
        "tags_added": added,
        "tags_removed": removed,
    }
    for event, which in (("contact.tag_added", added), ("contact.tag_removed", removed)):
        if which:  # ``tag``: the tags of the event, as the enrollment's variable shows them
            record(conn, project_id, event, None, now, contact_id=after.id, tag=", ".join(which), **tags)
    changed: dict[str, dict[str, Any]] = {}
    for name in ("name", "timezone"):
        if getattr(before, name) != getattr(after, name):
            changed[f"contact.{name}"] = {"from": getattr(before, name), "to": getattr(after, name)}
    for key in sorted(set(before.attributes) | set(after.attributes)):
        if before.attributes.get(key) != after.attributes.get(key):
            changed[f"contact.attributes.{key}"] = {
                "from": before.attributes.get(key),
                "to": after.attributes.get(key),
            }
    if changed:
        record(conn, project_id, "contact.updated", None, now, contact_id=after.id, changed=changed)
