"""Time-ordered ids (``core.ids``): UUIDs of version 7 whose order is their time's, and the key a follow-up's
message takes."""

from __future__ import annotations

import time
import uuid

from psycopg_pool import ConnectionPool

from libs.common.core.clock import ManualClock
from libs.common.core.ids import time_ordered_id
from libs.common.platform.messages import OutboundMessage
from tests.conftest import Project
from tests.factories import make_contact, make_enrollment, make_sequence
from tests.helpers import rows
from tests.release_helpers import release


def test_an_id_is_a_uuid_of_version_7_whose_first_48_bits_are_the_time_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    ids = [time_ordered_id() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for made in ids:
        assert made.version == 7
        assert made.variant == uuid.RFC_4122
        assert before <= made.int >> 80 <= after
    # the random bits are random: no bit of the 74 is the same in every id
    random_bits = [made.int & ((1 << 62) - 1) | ((made.int >> 64) & 0xFFF) << 62 for made in ids]
    for bit in range(74):
        assert len({value >> bit & 1 for value in random_bits}) == 2, bit


def test_ids_of_later_milliseconds_sort_after_earlier_ones() -> None:
    made = []
    for _ in range(5):
        made.append(time_ordered_id())
        time.sleep(0.002)
    assert made == sorted(made)
    assert [str(one) for one in made] == sorted(str(one) for one in made)  # as text too, as PostgreSQL sorts


def test_a_follow_ups_message_takes_a_time_ordered_id(
    pool: ConnectionPool, project: Project, clock: ManualClock
) -> None:
    sequence_id = make_sequence(pool, project.id)
    enrollment = make_enrollment(pool, clock, project.id, sequence_id, make_contact(pool, project.id))
    before = time.time_ns() // 1_000_000
    released = release(pool, clock)
    [(message_id,)] = rows(pool, "SELECT id FROM messages WHERE followup_enrollment_id = %s", enrollment.id)
    assert released.message_id == message_id
    assert message_id.version == 7
    assert before <= message_id.int >> 80 <= time.time_ns() // 1_000_000


def test_every_queued_outbound_message_takes_a_time_ordered_id_unless_its_sender_names_one() -> None:
    made = OutboundMessage(project_id=uuid.uuid4(), contact_id=uuid.uuid4(), body="hi", source="rule")
    assert made.id.version == 7
    named = uuid.uuid4()
    sent = OutboundMessage(uuid.uuid4(), uuid.uuid4(), body="hi", source="api", id=named)
    assert sent.id == named
