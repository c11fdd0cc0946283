-- name: skip_pending_executions
-- The contact's delayed executions still to come, skipped `contact_erased` (a sweeper that leased one finds
-- it no longer pending; one running it holds its row lock, and this waits for it).
UPDATE rule_pending_executions
SET status = 'skipped', skip_reason = 'contact_erased', locked_until = NULL, executed_at = %(now)s,
    updated_at = %(now)s
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND status = 'pending'
RETURNING id

-- name: forget_traces
-- The conditions' values the contact's finished executions kept (their decision trace: its name, its
-- attributes, ...); the rows stay for the audit, with nothing of the person.
UPDATE rule_pending_executions SET trace = NULL
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND trace IS NOT NULL

-- name: delete_triggers
-- The contact's recorded rule triggers (their rule runs go with them).
DELETE FROM followup_triggers WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s

-- name: delete_webhook_deliveries
-- The webhook deliveries about the contact (their bodies carry what the event said of it).
DELETE FROM webhook_deliveries
WHERE project_id = %(project_id)s AND payload ->> 'contact_id' = %(contact_id)s::text
