-- What the rules context deletes once its time is up (the retention job calls each, a project and a batch
-- at a time). Each delete picks its batch through the project's part of an index (the inner select) and
-- deletes it by primary key: ``id = ANY(ARRAY(...))`` makes the batch a list the outer DELETE looks up, not
-- a join that reads the whole table.

-- name: processed_triggers
-- A project's triggers processed more than 7 days ago (their rule runs go with them), but those a pending
-- delayed-rule execution still needs.
DELETE FROM followup_triggers
WHERE project_id = %(project_id)s AND id = ANY(ARRAY(
    SELECT t.id FROM followup_triggers t
    WHERE t.project_id = %(project_id)s AND t.processed_at IS NOT NULL
      AND t.processed_at < %(now)s::timestamptz - interval '7 days'
      AND NOT EXISTS (SELECT 1 FROM rule_pending_executions e
                      WHERE e.project_id = t.project_id AND e.trigger_id = t.id AND e.status = 'pending')
    ORDER BY t.processed_at
    LIMIT %(limit)s
))

-- name: rule_executions
-- A project's executed and skipped delayed-rule executions older than 30 days (seed 002 keeps them that
-- long).
DELETE FROM rule_pending_executions
WHERE project_id = %(project_id)s AND id = ANY(ARRAY(
    SELECT id FROM rule_pending_executions
    WHERE project_id = %(project_id)s AND status <> 'pending'
      AND updated_at < %(now)s::timestamptz - interval '30 days'
    ORDER BY updated_at
    LIMIT %(limit)s
))

-- name: bulk_jobs
-- A project's bulk jobs finished more than 30 days ago, with their contacts.
DELETE FROM followup_bulk_jobs
WHERE project_id = %(project_id)s AND id = ANY(ARRAY(
    SELECT id FROM followup_bulk_jobs
    WHERE project_id = %(project_id)s AND status IN ('completed', 'cancelled', 'failed')
      AND finished_at < %(now)s::timestamptz - interval '30 days'
    ORDER BY finished_at
    LIMIT %(limit)s
))

-- name: webhook_deliveries
-- A project's delivered and given-up webhook deliveries older than 30 days.
DELETE FROM webhook_deliveries
WHERE project_id = %(project_id)s AND id = ANY(ARRAY(
    SELECT id FROM webhook_deliveries
    WHERE project_id = %(project_id)s AND status <> 'pending'
      AND updated_at < %(now)s::timestamptz - interval '30 days'
    ORDER BY updated_at
    LIMIT %(limit)s
))
