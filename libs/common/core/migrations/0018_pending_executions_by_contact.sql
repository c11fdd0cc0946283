-- A contact's delayed executions still to come, by project: the erasure skips them (contact_erased) and the
-- contact card lists them, without a scan of every project's executions.
CREATE INDEX rule_pending_executions_contact_idx ON rule_pending_executions (project_id, contact_id, due_at)
    WHERE status = 'pending';
