-- The retention job's own statements: its lock (the deletes are the owners': followups/transitions.sql,
-- rules/purge.sql, core/outbox.sql).

-- name: try_lock
-- The retention job runs in one process at a time (a session advisory lock; nothing when another holds it).
SELECT pg_try_advisory_lock(hashtext('followups-retention'))

-- name: unlock
-- Let the next run take the job.
SELECT pg_advisory_unlock(hashtext('followups-retention'))
