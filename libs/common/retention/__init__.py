"""Retention: what is deleted when, in small batches, each walking an index (see ``cleanup.sql``).

Owns no table: it deletes what the other contexts leave behind once their time is up. May import: followups,
platform, core and contracts (it touches their tables through its own named queries only).
"""
