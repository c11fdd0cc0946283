"""Ingress of contact events: an opt-out (which stops every follow-up), an opt-in, and a privacy erasure
(everything stopped, then every context erases its part). Contact changes made through the API are
:mod:`libs.common.ingress.contact_changes`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from libs.common.contracts.platform_events import ContactErased, ContactOptedIn, ContactOptedOut
from libs.common.core import outbox
from libs.common.followups import erasure as followups_erasure
from libs.common.ingress.apply import EventResult, stop
from libs.common.platform import contacts
from libs.common.rules import erasure as rules_erasure


def opted_out(
    conn: Connection[Any], project_id: uuid.UUID, event: ContactOptedOut, now: datetime
) -> EventResult:
    contacts.lock_contact(conn, project_id, event.contact_id)
    changed = contacts.opt_out(conn, project_id, event.contact_id, now=now)
    result = EventResult(type="contact.opted_out", applied=changed, contact_id=event.contact_id)
    return stop(conn, project_id, event.contact_id, "opt_out", now, result)


def opted_in(
    conn: Connection[Any], project_id: uuid.UUID, event: ContactOptedIn, now: datetime
) -> EventResult:
    contacts.lock_contact(conn, project_id, event.contact_id)
    changed = contacts.opt_in(conn, project_id, event.contact_id, now=now)
    return EventResult(type="contact.opted_in", applied=changed, contact_id=event.contact_id)


def erased(conn: Connection[Any], project_id: uuid.UUID, event: ContactErased, now: datetime) -> EventResult:
    """Privacy erasure: stop everything, then each context erases its part (nothing left that identifies
    the person)."""
    contacts.lock_contact_for_erasure(conn, project_id, event.contact_id)
    result = stop(
        conn,
        project_id,
        event.contact_id,
        "any",
        now,
        EventResult(type="contact.erased", contact_id=event.contact_id),
    )
    followups_erasure.erase_contact(conn, project_id, event.contact_id, now=now)
    rules_erasure.erase_contact(conn, project_id, event.contact_id, now=now)
    outbox.erase_contact(conn, project_id, event.contact_id)
    contacts.erase_contact(conn, project_id, event.contact_id, now=now)
    return result
