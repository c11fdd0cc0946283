-- Retention: every clean-up walks an index to the rows it deletes.

-- published outbox rows, by when they were published
CREATE INDEX outbox_published_idx ON outbox (published_at) WHERE published_at IS NOT NULL;
-- a processed trigger a pending delayed-rule execution still needs (its message and changed set) is kept
CREATE INDEX rule_pending_executions_trigger_idx ON rule_pending_executions (trigger_id) WHERE status = 'pending';
-- finished bulk jobs, by when they finished
CREATE INDEX followup_bulk_jobs_finished_idx ON followup_bulk_jobs (finished_at)
    WHERE status IN ('completed', 'cancelled', 'failed');
-- delivered and given-up webhook deliveries, by their last change
CREATE INDEX webhook_deliveries_done_idx ON webhook_deliveries (updated_at) WHERE status <> 'pending';
