"""What the outbox tests share: an event of their own."""

from __future__ import annotations

import uuid
from typing import ClassVar

from libs.common.contracts.events import Event


class Happened(Event, kw_only=True, frozen=True):
    """An event of the tests' own: the n-th thing that happened to one aggregate."""

    type: ClassVar[str] = "test.happened"
    aggregate_type: ClassVar[str] = "thing"

    thing_id: uuid.UUID
    seq: int

    @property
    def aggregate_id(self) -> uuid.UUID:
        return self.thing_id
