-- Rules: one model for seed 002's delayed automation rules and seed 000's trigger rules.

CREATE TABLE rules (
    id                       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id               uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name                     text NOT NULL,
    event                    text NOT NULL,
    conditions               jsonb NOT NULL DEFAULT '[]'::jsonb,
    actions                  jsonb NOT NULL,
    execution_delay_minutes  integer CHECK (execution_delay_minutes > 0),  -- NULL: act immediately
    active                   boolean NOT NULL DEFAULT true,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rules_project_event_idx ON rules (project_id, event) WHERE active;

CREATE TABLE rule_pending_executions (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id       uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    rule_id          uuid NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    conversation_id  uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    episode_key      text NOT NULL,
    due_at           timestamptz NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'processing', 'executing', 'executed', 'skipped')),
    skip_reason      text,
    message_id       uuid,
    locked_until     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT rule_pending_executions_episode_key UNIQUE (rule_id, conversation_id, episode_key)
);
-- the sweep
CREATE INDEX rule_pending_executions_due_idx ON rule_pending_executions (status, due_at);
