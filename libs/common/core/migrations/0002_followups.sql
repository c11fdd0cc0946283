-- Follow-ups (seed 000, section Data).

CREATE TABLE followup_settings (
    project_id            uuid PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    retention_days        integer NOT NULL DEFAULT 90 CHECK (retention_days > 0),
    send_window           jsonb,          -- {"days": [...], "start": "09:00", "end": "20:00"}; NULL = always
    consent_mode          text NOT NULL DEFAULT 'off' CHECK (consent_mode IN ('off', 'required')),
    send_delay_ms         integer NOT NULL DEFAULT 0 CHECK (send_delay_ms >= 0),
    max_per_contact_24h   integer CHECK (max_per_contact_24h > 0),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE followup_sequences (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id          uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name                text NOT NULL,
    status              text NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'active', 'paused', 'archived')),
    draft               jsonb NOT NULL,  -- the editable definition: steps, re-entry, stop flags
    current_version_id  uuid,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX followup_sequences_project_idx ON followup_sequences (project_id, created_at);

-- Immutable once written: enrollments pin one. sequence_id NULL = a one-off version.
CREATE TABLE followup_sequence_versions (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id   uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    sequence_id  uuid REFERENCES followup_sequences (id) ON DELETE CASCADE,
    version      integer NOT NULL DEFAULT 1,
    definition   jsonb NOT NULL,
    step_count   integer NOT NULL CHECK (step_count > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT followup_sequence_versions_number_key UNIQUE (sequence_id, version)
);
ALTER TABLE followup_sequences
    ADD CONSTRAINT followup_sequences_current_version_fkey
    FOREIGN KEY (current_version_id) REFERENCES followup_sequence_versions (id);

CREATE TABLE followup_enrollments (
    id                        uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id                uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    sequence_id               uuid REFERENCES followup_sequences (id) ON DELETE SET NULL,
    version_id                uuid NOT NULL REFERENCES followup_sequence_versions (id),
    contact_id                uuid NOT NULL REFERENCES contacts (id) ON DELETE CASCADE,
    conversation_id           uuid,
    number_id                 uuid,  -- number preference (NULL: the sending rules choose)
    status                    text NOT NULL DEFAULT 'active'
                              CHECK (status IN ('active', 'paused', 'completed', 'stopped', 'failed')),
    source                    text NOT NULL DEFAULT 'api',
    step_index                integer NOT NULL DEFAULT 0,
    next_run_at               timestamptz NOT NULL,
    anchor_at                 timestamptz,
    variables                 jsonb NOT NULL DEFAULT '{}'::jsonb,
    dedupe_key                text,
    -- stop flags, copied from the sequence version at enrollment: every stop path is one indexed UPDATE
    stop_on_reply             boolean NOT NULL DEFAULT true,
    stop_on_human_message     boolean NOT NULL DEFAULT true,
    stop_on_opt_out           boolean NOT NULL DEFAULT true,
    stop_on_lead_closed       boolean NOT NULL DEFAULT true,
    stop_on_conversation_resolved boolean NOT NULL DEFAULT true,
    -- lease and fence (AI steps): locked_until is the lease, attempts the fence
    locked_until              timestamptz,
    attempts                  integer NOT NULL DEFAULT 0,
    failure_count             integer NOT NULL DEFAULT 0,
    last_error                text,
    last_message_id           uuid,
    last_step_at              timestamptz,
    unavailable_since         timestamptz,
    reason                    text,  -- why it is paused, stopped or failed
    note                      text,  -- a free-text note given with a manual stop
    enrolled_at               timestamptz NOT NULL,
    finished_at               timestamptz,
    updated_at                timestamptz NOT NULL
);
-- one live enrollment per sequence and contact
CREATE UNIQUE INDEX followup_enrollments_one_live_idx ON followup_enrollments (sequence_id, contact_id)
    WHERE status IN ('active', 'paused') AND sequence_id IS NOT NULL;
-- business-level idempotency
CREATE UNIQUE INDEX followup_enrollments_dedupe_idx ON followup_enrollments (project_id, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
-- the claim: only active rows, ordered by due time, so the cost stays flat as the backlog grows
CREATE INDEX followup_enrollments_claim_idx ON followup_enrollments (next_run_at) WHERE status = 'active';
-- the stop paths: UPDATE ... RETURNING over a contact's live enrollments
CREATE INDEX followup_enrollments_live_contact_idx ON followup_enrollments (contact_id)
    WHERE status IN ('active', 'paused');
CREATE INDEX followup_enrollments_sequence_idx ON followup_enrollments (sequence_id, status);
-- the plan limit: live enrollments per project
CREATE INDEX followup_enrollments_live_project_idx ON followup_enrollments (project_id)
    WHERE status IN ('active', 'paused');
CREATE INDEX followup_enrollments_contact_idx ON followup_enrollments (contact_id, sequence_id);
CREATE INDEX followup_enrollments_finished_idx ON followup_enrollments (finished_at)
    WHERE finished_at IS NOT NULL;

-- One row per (enrollment, step): no retry can ever send a step twice.
CREATE TABLE followup_step_runs (
    enrollment_id  uuid NOT NULL REFERENCES followup_enrollments (id) ON DELETE CASCADE,
    step_index     integer NOT NULL,
    project_id     uuid NOT NULL,
    outcome        text NOT NULL CHECK (outcome IN ('queued', 'skipped')),
    reason         text,
    message_id     uuid,
    due_at         timestamptz NOT NULL,
    ran_at         timestamptz NOT NULL,
    PRIMARY KEY (enrollment_id, step_index)
);

-- Events that may fire rules, recorded only when the project has an enabled rule for the type.
CREATE TABLE followup_triggers (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id    uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    type          text NOT NULL,
    contact_id    uuid,
    conversation_id uuid,
    payload       jsonb NOT NULL DEFAULT '{}'::jsonb,
    occurred_at   timestamptz NOT NULL,
    attempts      integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    last_error    text,
    processed_at  timestamptz
);
CREATE INDEX followup_triggers_pending_idx ON followup_triggers (next_attempt_at) WHERE processed_at IS NULL;
CREATE INDEX followup_triggers_processed_idx ON followup_triggers (processed_at) WHERE processed_at IS NOT NULL;

CREATE TABLE followup_bulk_jobs (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id    uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    sequence_id   uuid NOT NULL REFERENCES followup_sequences (id) ON DELETE CASCADE,
    contact_ids   uuid[],   -- an explicit list ...
    segment       jsonb,    -- ... or a frozen segment rule
    cursor        text,
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    locked_until  timestamptz,
    enrolled      integer NOT NULL DEFAULT 0,
    rejected      integer NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    CHECK ((contact_ids IS NULL) <> (segment IS NULL))
);
CREATE INDEX followup_bulk_jobs_open_idx ON followup_bulk_jobs (created_at) WHERE status IN ('pending', 'running');

-- Pacing per sending number: the next moment a follow-up may be released on it.
CREATE TABLE followup_instance_pacing (
    number_id        uuid PRIMARY KEY REFERENCES numbers (id) ON DELETE CASCADE,
    project_id       uuid NOT NULL,
    next_release_at  timestamptz NOT NULL
);

-- AI budget ledger (kind 'followup' for AI steps).
CREATE TABLE ai_budget_ledger (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id   uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    kind         text NOT NULL,
    tokens       integer NOT NULL DEFAULT 0,
    cost_micros  bigint NOT NULL DEFAULT 0,
    reference_id uuid,
    occurred_at  timestamptz NOT NULL
);
CREATE INDEX ai_budget_ledger_project_idx ON ai_budget_ledger (project_id, kind, occurred_at);
