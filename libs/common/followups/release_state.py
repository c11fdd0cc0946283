"""What the release step reads before it decides: the claimed enrollment's contact, its project, its
sequence and what the sending constraints read (:class:`ReleaseState`), locking the contact (shared, SKIP
LOCKED: a contact a stop path holds is never waited for) and the open conversation a queued message threads
into. The release loop reads it with its claim, in one statement (:data:`CLAIM_WITH_STATE`); a step whose
read needs what the claim does not know (its sequence's fixed number, the previous message's status), and
the AI step's second pass and the preview, read it alone (:func:`read_state`)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

import msgspec
from psycopg import Connection
from psycopg.pq.abc import PGresult
from psycopg.rows import RowMaker, class_row

from libs.common.core.queued import read_row
from libs.common.core.sql import load_queries, numbered
from libs.common.followups import release_claim
from libs.common.followups.constraints import ConstraintState
from libs.common.followups.project_settings import DEFAULTS
from libs.common.followups.release_claim import ClaimedEnrollment

QUERIES = load_queries("libs.common.followups", "release_state.sql")


class ReleaseState(ConstraintState, frozen=True):
    """The contact's state (read under its share lock), its project's, its sequence's, and what the
    sending constraints read."""

    opted_out: bool
    erased: bool
    #: The provider said the phone cannot receive (131026, ...).
    undeliverable: bool
    name: str | None
    phone: str | None
    attributes: dict[str, Any]
    plan_active: bool
    sequence_status: str | None
    #: The contact's last reply since enrollment, if any.
    replied_at: datetime | None
    last_message_status: str | None
    #: The open conversation a queued message threads into, locked with the contact (None: none is open,
    #: or ``open_conversation_busy``: another transaction holds it).
    open_conversation_id: uuid.UUID | None
    open_conversation_number_id: uuid.UUID | None
    open_conversation_busy: bool


def read_state(conn: Connection[Any], params: dict[str, Any]) -> ReleaseState | None:
    """The contact's state for a claimed enrollment (``release_state``'s parameters); None when another
    transaction holds the contact (the step comes back shortly)."""
    with conn.cursor(row_factory=class_row(ReleaseState)) as cur:
        return cur.execute(QUERIES["release_state"], params).fetchone()


#: ``release_state``'s parameters as the claimed row gives them, for a step that reads neither its
#: sequence's fixed number nor the previous message's status (:func:`release_claimed` computes the same).
_FROM_CLAIM = {
    "contact_id": "e.contact_id",
    "sequence_id": "e.sequence_id",
    "enrolled_at": "greatest(e.enrolled_at, e.reply_taken_at)",
    "last_message_id": "NULL",
    "number_id": "e.number_id",
    "fixed_number_id": "NULL",
    "conversation_id": "e.conversation_id",
}
#: The release claim and the contact's state in one statement, one round trip where there were two: the
#: claimed row's columns, ``contact_locked``, then ``release_state``'s columns (nulls when the contact is
#: locked). The enrollment is locked first, then the contact and its conversation, as before.
#: Numbered once: psycopg would parse it at every claim (it is longer than its cache takes).
CLAIM_WITH_STATE = numbered(
    f"WITH claimed AS (\n{release_claim.QUERIES['claim_due_enrollment']}\n)\n"
    "SELECT e.*, st.opted_out IS NULL AS contact_locked, st.*\nFROM claimed e\nLEFT JOIN LATERAL (\n"
    + re.sub(
        r"%\((\w+)\)s",
        lambda m: _FROM_CLAIM.get(m.group(1), m.group(0)),
        QUERIES["release_state"],
    )
    + "\n) st ON true"
)


class ReadWithClaim(msgspec.Struct, frozen=True):
    """The contact's state as :data:`CLAIM_WITH_STATE` read it (None: the contact was locked by another
    transaction)."""

    state: ReleaseState | None


def claim_release(
    conn: Connection[Any], project_id: uuid.UUID, now: datetime
) -> tuple[ClaimedEnrollment, ReadWithClaim] | None:
    """Claim the project's oldest due enrollment (``release_claim.sql::claim_due_enrollment``: locked, rows
    locked by other workers skipped) and read its contact's state in the same statement; None when none is
    due."""
    params = {
        "project_id": project_id,
        "now": now,
        "default_recipient_gap": DEFAULTS.min_recipient_gap_seconds,
    }
    return read_row(conn, CLAIM_WITH_STATE, params, _claimed_with_state)


def _claimed_with_state(result: PGresult) -> RowMaker[tuple[ClaimedEnrollment, ReadWithClaim]]:
    """The row maker of :data:`CLAIM_WITH_STATE`: the claimed row, and the state after ``contact_locked``,
    each made by position."""
    columns = _columns(result)
    claim_values, locked, state_values = columns.claim, columns.locked, columns.state

    def make(values: Sequence[Any]) -> tuple[ClaimedEnrollment, ReadWithClaim]:
        row = ClaimedEnrollment(*claim_values(values))
        if values[locked]:
            return row, ReadWithClaim(None)
        return row, ReadWithClaim(ReleaseState(*state_values(values)))

    return make


@dataclass(frozen=True)
class _Columns:
    """Where :data:`CLAIM_WITH_STATE`'s row holds what: each picker takes a row's values in its struct's
    field order."""

    claim: Callable[[Sequence[Any]], tuple[Any, ...]]
    locked: int
    state: Callable[[Sequence[Any]], tuple[Any, ...]]


#: :data:`CLAIM_WITH_STATE`'s columns by their count (one entry: the statement's columns never change).
_COLUMNS: dict[int, _Columns] = {}


def _columns(result: PGresult) -> _Columns:
    """:data:`CLAIM_WITH_STATE`'s columns, read once (its 60 columns are not described at every claim): the
    claimed row's before ``contact_locked``, the state's after it (a field without its column: KeyError)."""
    count = result.nfields
    found = _COLUMNS.get(count)
    if found is None:
        names = [(result.fname(i) or b"").decode() for i in range(count)]
        locked = names.index("contact_locked")
        claim = {name: i for i, name in enumerate(names[:locked])}
        state = {name: i for i, name in enumerate(names) if i > locked}
        found = _COLUMNS[count] = _Columns(
            itemgetter(*(claim[name] for name in ClaimedEnrollment.__struct_fields__)),
            locked,
            itemgetter(*(state[name] for name in ReleaseState.__struct_fields__)),
        )
    return found
