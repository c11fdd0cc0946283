"""Ids made in Python for rows of the largest tables: time-ordered, so an index on them grows at one end.

A random id (UUID version 4) puts each new row's key at a random leaf of its index: once the index is
larger than PostgreSQL's buffers, every insert reads a leaf from outside them and dirties it. A UUID version
7 (RFC 9562) leads with the time in milliseconds, so the rows written in a moment share a few leaves at the
index's right end, as a sequence's numbers do, while the id stays as hard to guess as it needs to be: 74
random bits follow the time.
"""

from __future__ import annotations

import os
import time
import uuid

#: The version's 4 bits and the variant's 2, cleared from 128 random-and-time bits, then set (7, and 0b10).
_CLEAR = ~(0xF << 76 | 0x3 << 62) & ((1 << 128) - 1)
_VERSION_AND_VARIANT = 0x7 << 76 | 0b10 << 62


def time_ordered_id() -> uuid.UUID:
    """A UUID version 7: the Unix time in milliseconds (48 bits), the version, 12 random bits, the variant,
    62 random bits. Ids of different milliseconds sort by time; within one millisecond, at random."""
    millis = time.time_ns() // 1_000_000
    bits = int.from_bytes((millis & 0xFFFF_FFFF_FFFF).to_bytes(6, "big") + os.urandom(10), "big")
    return uuid.UUID(int=bits & _CLEAR | _VERSION_AND_VARIANT)
