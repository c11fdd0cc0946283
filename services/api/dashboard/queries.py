"""What the dashboard's pages show beside the domain's own reads (a project's name for the header, the
names of a list's contacts and sequences in one query instead of one a row; a contact typed as its phone or
id), each asked of the table's owner. Every query filters on the signed-in project."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from psycopg import Connection

from libs.common.core.errors import InvalidInput, NotFound
from libs.common.followups import campaigns, sequences
from libs.common.platform import contacts, projects
from libs.common.rules import rules
from services.api.dashboard.forms import FormErrors


@dataclass(frozen=True)
class ProjectHeader:
    name: str
    timezone: str


def project_header(conn: Connection[Any], project_id: uuid.UUID) -> ProjectHeader:
    found = projects.project_name(conn, project_id)
    return ProjectHeader(*found) if found else ProjectHeader("", "UTC")


def contact_labels(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """Each contact's name (else its phone, else "erased")."""
    rows = contacts.contact_names(conn, project_id, ids)
    return {id_: name or phone or "erased contact" for id_, name, phone in rows}


def sequence_names(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]
) -> dict[uuid.UUID, str]:
    return sequences.sequence_names(conn, project_id, ids)


def campaign_labels(
    conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """Each campaign's name (else its id: a campaign need not have one)."""
    names = campaigns.campaign_names(conn, project_id, ids)
    return {id_: names.get(id_, str(id_)) for id_ in ids}


def rule_labels(conn: Connection[Any], project_id: uuid.UUID, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Each rule's name ("deleted rule" when it is gone): one read a distinct rule of a page's rows."""
    labels: dict[uuid.UUID, str] = {}
    for rule_id in dict.fromkeys(ids):
        try:
            labels[rule_id] = rules.get_rule(conn, project_id, rule_id).name
        except NotFound:
            labels[rule_id] = "deleted rule"
    return labels


def typed_contact_id(
    conn: Connection[Any], project_id: uuid.UUID, text: str, errors: FormErrors, field: str = "contact"
) -> uuid.UUID | None:
    """A contact typed into a form as its id or its phone number (None, with an error on ``field``, when it
    is neither or no contact has that phone)."""
    text = text.strip()
    if not text:
        errors.add(field, "enter the contact's phone number (or id)")
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        pass
    try:
        found = contacts.list_contacts(conn, project_id, limit=1, phone=text)
    except InvalidInput:
        errors.add(field, "enter the contact's E.164 phone number (such as +14155550123) or its id")
        return None
    if not found:
        errors.add(field, f"no contact has the phone number {text}")
        return None
    return found[0].id
