-- Rules (issue: one model for every automation): their order, the conversation fields their actions set,
-- what each rule did with each trigger, and webhook deliveries.

-- rules run in position order (then creation order); conditions are a tree of all / any groups
ALTER TABLE rules
    ADD COLUMN position integer NOT NULL DEFAULT 0,
    ALTER COLUMN conditions SET DEFAULT '{"all": []}'::jsonb;
UPDATE rules SET conditions = '{"all": []}'::jsonb WHERE conditions = '[]'::jsonb;
CREATE INDEX rules_project_position_idx ON rules (project_id, position, created_at, id);

-- what an assign_team and a snooze_until action set, and the conversation's custom attributes
ALTER TABLE conversations
    ADD COLUMN team           text,
    ADD COLUMN snoozed_until  timestamptz,
    ADD COLUMN attributes     jsonb NOT NULL DEFAULT '{}'::jsonb;

-- what processing a trigger came to: processed (every matching rule ran), failed (given up after retries)
ALTER TABLE followup_triggers
    ADD COLUMN outcome text CHECK (outcome IN ('processed', 'failed'));

-- what each rule did with a trigger; a retried trigger skips the rules that already ran
CREATE TABLE rule_runs (
    trigger_id  bigint NOT NULL REFERENCES followup_triggers (id) ON DELETE CASCADE,
    rule_id     uuid NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    project_id  uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    outcome     text NOT NULL CHECK (outcome IN ('executed', 'rejected')),
    detail      text,
    ran_at      timestamptz NOT NULL,
    PRIMARY KEY (trigger_id, rule_id)
);
CREATE INDEX rule_runs_rule_idx ON rule_runs (rule_id, ran_at);

-- the key that signs a project's webhooks (HMAC-SHA256)
ALTER TABLE projects
    ADD COLUMN webhook_secret text NOT NULL DEFAULT replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');

-- a send_webhook action's deliveries: each attempt's result is kept, retried with backoff until delivered
CREATE TABLE webhook_deliveries (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id       uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    rule_id          uuid REFERENCES rules (id) ON DELETE SET NULL,
    trigger_id       bigint,
    url              text NOT NULL,
    payload          jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    last_status_code integer,
    last_error       text,
    created_at       timestamptz NOT NULL,
    delivered_at     timestamptz,
    updated_at       timestamptz NOT NULL
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_project_idx ON webhook_deliveries (project_id, created_at, id);
