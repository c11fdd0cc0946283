-- name: try_lock
-- The retention job runs in one process at a time (a session advisory lock; nothing when another holds it).
SELECT pg_try_advisory_lock(hashtext('followups-retention'))

-- name: unlock
-- Let the next run take the job.
SELECT pg_advisory_unlock(hashtext('followups-retention'))

-- Each delete picks its batch through an index (the inner select) and deletes it by primary key:
-- ``id = ANY(ARRAY(...))`` makes the batch a list the outer DELETE looks up, not a join that reads the
-- whole table.

-- name: finished_enrollments
-- Finished enrollments older than their project's retention_days (default 90), oldest first; their step
-- runs go with them (the messages stay: they keep the enrollment's id without a foreign key).
DELETE FROM followup_enrollments
WHERE id = ANY(ARRAY(
    SELECT e.id FROM followup_enrollments e
    LEFT JOIN followup_settings s ON s.project_id = e.project_id
    WHERE e.status IN ('completed', 'stopped', 'failed')
      AND e.finished_at < %(now)s::timestamptz - interval '1 day'
      AND e.finished_at < %(now)s::timestamptz - make_interval(days => coalesce(s.retention_days, 90))
    ORDER BY e.finished_at
    LIMIT %(limit)s
))

-- name: processed_triggers
-- Processed triggers older than 7 days (their rule runs go with them), but those a pending delayed-rule
-- execution still needs.
DELETE FROM followup_triggers
WHERE id = ANY(ARRAY(
    SELECT t.id FROM followup_triggers t
    WHERE t.processed_at IS NOT NULL AND t.processed_at < %(now)s::timestamptz - interval '7 days'
      AND NOT EXISTS (SELECT 1 FROM rule_pending_executions e WHERE e.trigger_id = t.id AND e.status = 'pending')
    ORDER BY t.processed_at
    LIMIT %(limit)s
))

-- name: rule_executions
-- Executed and skipped delayed-rule executions older than 30 days (seed 002 keeps them that long).
DELETE FROM rule_pending_executions
WHERE id = ANY(ARRAY(
    SELECT id FROM rule_pending_executions
    WHERE status <> 'pending' AND updated_at < %(now)s::timestamptz - interval '30 days'
    ORDER BY updated_at
    LIMIT %(limit)s
))

-- name: bulk_jobs
-- Finished bulk jobs older than 30 days, with their contacts.
DELETE FROM followup_bulk_jobs
WHERE id = ANY(ARRAY(
    SELECT id FROM followup_bulk_jobs
    WHERE status IN ('completed', 'cancelled', 'failed') AND finished_at < %(now)s::timestamptz - interval '30 days'
    ORDER BY finished_at
    LIMIT %(limit)s
))

-- name: webhook_deliveries
-- Delivered and given-up webhook deliveries older than 30 days.
DELETE FROM webhook_deliveries
WHERE id = ANY(ARRAY(
    SELECT id FROM webhook_deliveries
    WHERE status <> 'pending' AND updated_at < %(now)s::timestamptz - interval '30 days'
    ORDER BY updated_at
    LIMIT %(limit)s
))

-- name: published_outbox
-- Outbox rows published more than 7 days ago.
DELETE FROM outbox
WHERE id = ANY(ARRAY(
    SELECT id FROM outbox
    WHERE published_at IS NOT NULL AND published_at < %(now)s::timestamptz - interval '7 days'
    ORDER BY published_at
    LIMIT %(limit)s
))
