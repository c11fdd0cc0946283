"""The actions on the event's contact: its tags."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from psycopg import Connection

from libs.common.contracts.limits import Tag
from libs.common.platform import contacts
from libs.common.rules.actions.base import ITEMS_BOUNDS, BaseAction, Check, Done, Subject, check_items, form

#: The tags of a tag action's input.
_TAGS = form("Tags (comma separated)")


class AddContactTag(BaseAction, kw_only=True, tag="add_contact_tag"):
    """Add tags to the contact."""

    tags: Annotated[list[Tag], _TAGS, ITEMS_BOUNDS]

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        check_items(self.tags, "tags", where)

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> Check:
        return contacts.send_tags_change(conn, "add", subject.project_id, subject.contact_id, self.tags)


class RemoveContactTag(BaseAction, kw_only=True, tag="remove_contact_tag"):
    """Remove tags from the contact."""

    tags: Annotated[list[Tag], _TAGS, ITEMS_BOUNDS]

    def validate(self, conn: Connection[Any], project_id: uuid.UUID, where: str) -> None:
        check_items(self.tags, "tags", where)

    def run(
        self, conn: Connection[Any], rule_id: uuid.UUID, subject: Subject, now: datetime, done: Done
    ) -> Check:
        return contacts.send_tags_change(conn, "remove", subject.project_id, subject.contact_id, self.tags)
