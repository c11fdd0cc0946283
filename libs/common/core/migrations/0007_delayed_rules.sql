-- Delayed rules (seed 002): a matching event records a pending execution keyed by its episode; the sweep
-- re-checks the rule when it is due and runs it, or skips it with the reason.

-- statuses: pending (waiting, or leased by a sweeper until locked_until), executed, skipped (skip_reason:
-- rule_inactive, conversation_gone, episode_moved, conditions_changed, expired, failed)
ALTER TABLE rule_pending_executions DROP CONSTRAINT rule_pending_executions_status_check;
UPDATE rule_pending_executions SET status = 'pending' WHERE status IN ('processing', 'executing');
ALTER TABLE rule_pending_executions
    ADD CONSTRAINT rule_pending_executions_status_check CHECK (status IN ('pending', 'executed', 'skipped')),
    -- a deleted conversation keeps the audit row (skipped conversation_gone at fire time)
    DROP CONSTRAINT rule_pending_executions_conversation_id_fkey,
    ALTER COLUMN conversation_id DROP NOT NULL,
    ADD COLUMN contact_id    uuid REFERENCES contacts (id) ON DELETE SET NULL,
    -- the trigger whose event opened the episode: the message and the changed set the conditions see
    ADD COLUMN trigger_id    bigint,
    ADD COLUMN episode_kind  text NOT NULL DEFAULT 'event'
                             CHECK (episode_kind IN ('status', 'reply_chase', 'awaiting_agent', 'event')),
    ADD COLUMN attempts      integer NOT NULL DEFAULT 0,
    ADD COLUMN last_error    text,
    ADD COLUMN executed_at   timestamptz;
ALTER TABLE rule_pending_executions
    ADD CONSTRAINT rule_pending_executions_conversation_id_fkey
        FOREIGN KEY (conversation_id) REFERENCES conversations (id) ON DELETE SET NULL;
-- the sweep walks pending rows by due time only
DROP INDEX rule_pending_executions_due_idx;
CREATE INDEX rule_pending_executions_due_idx ON rule_pending_executions (due_at) WHERE status = 'pending';
CREATE INDEX rule_pending_executions_rule_idx ON rule_pending_executions (rule_id, created_at, id);
CREATE INDEX rule_pending_executions_conversation_idx ON rule_pending_executions (conversation_id, created_at, id);
-- retention prunes executed and skipped rows after 30 days
CREATE INDEX rule_pending_executions_done_idx ON rule_pending_executions (updated_at) WHERE status <> 'pending';

-- a delay counted in the project's business hours only
ALTER TABLE rules ADD COLUMN delay_in_business_hours boolean NOT NULL DEFAULT false;
ALTER TABLE followup_settings ADD COLUMN business_hours jsonb;

-- what a delayed rule did with its trigger: scheduled a pending execution
ALTER TABLE rule_runs DROP CONSTRAINT rule_runs_outcome_check;
ALTER TABLE rule_runs ADD CONSTRAINT rule_runs_outcome_check CHECK (outcome IN ('executed', 'rejected', 'scheduled'));
