-- name: take_preview_slot
-- One of a project's preview slots (the key names the project and the slot), held until the transaction
-- ends; false when another transaction holds it (never waits).
SELECT pg_try_advisory_xact_lock(hashtextextended(%(key)s, 0))
