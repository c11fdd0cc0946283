-- Every tenant table is keyed by its project first (issue 26, the data model; docs/scaling.md): project_id
-- leads every primary key, every unique constraint and unique index, and both sides of every foreign key
-- between tenant tables, so that each table could be distributed by project_id (Citus) with its related
-- rows on the same node, and a statement with an equality on project_id routed to one shard. The global
-- tables are few and named (libs/common/core/distribution.py: REFERENCE_TABLES): projects, api_keys,
-- dashboard_sessions and schema_migrations keep their keys, and foreign keys to them stay as they are.
--
-- Constraint and index names are kept (the code maps some of them to domain errors). Every key is rebuilt
-- in this one transaction, each table locked while its indexes are built: on a large database, run it in a
-- quiet hour.

-- 1. The two tenant tables without a project_id take it from their parent row.

-- A bulk job's contacts: the job's project.
ALTER TABLE followup_bulk_job_items ADD COLUMN project_id uuid;
UPDATE followup_bulk_job_items i SET project_id = j.project_id FROM followup_bulk_jobs j WHERE j.id = i.job_id;
ALTER TABLE followup_bulk_job_items ALTER COLUMN project_id SET NOT NULL;

-- The message counters: a project's queue is counted under the project, a number's in-flight window under
-- the number's project. A number's counters outlive nothing: its messages' number_id is set null when it
-- is deleted (which counts them out), so a counter of a number that is gone holds 0 and goes.
ALTER TABLE message_counters ADD COLUMN project_id uuid;
UPDATE message_counters SET project_id = owner_id WHERE kind = 'project_queued';
UPDATE message_counters c SET project_id = n.project_id
FROM numbers n WHERE c.kind = 'number_in_flight' AND n.id = c.owner_id;
DELETE FROM message_counters WHERE project_id IS NULL;
ALTER TABLE message_counters ALTER COLUMN project_id SET NOT NULL;

-- 2. The foreign keys between tenant tables go while the keys they point at are rebuilt (those to projects
--    stay: a reference table).
ALTER TABLE activities DROP CONSTRAINT activities_contact_id_fkey;
ALTER TABLE channel_numbers DROP CONSTRAINT channel_numbers_number_id_fkey;
ALTER TABLE conversations DROP CONSTRAINT conversations_contact_id_fkey,
                          DROP CONSTRAINT conversations_number_id_fkey;
ALTER TABLE deals DROP CONSTRAINT deals_contact_id_fkey;
ALTER TABLE followup_bulk_job_items DROP CONSTRAINT followup_bulk_job_items_job_id_fkey;
ALTER TABLE followup_bulk_jobs DROP CONSTRAINT followup_bulk_jobs_sequence_id_fkey;
ALTER TABLE followup_campaigns DROP CONSTRAINT followup_campaigns_sequence_id_fkey;
ALTER TABLE followup_enrollments DROP CONSTRAINT followup_enrollments_contact_id_fkey,
                                 DROP CONSTRAINT followup_enrollments_sequence_id_fkey,
                                 DROP CONSTRAINT followup_enrollments_version_id_fkey;
ALTER TABLE followup_instance_pacing DROP CONSTRAINT followup_instance_pacing_number_id_fkey;
ALTER TABLE followup_sequence_versions DROP CONSTRAINT followup_sequence_versions_sequence_id_fkey;
ALTER TABLE followup_sequences DROP CONSTRAINT followup_sequences_current_version_fkey;
ALTER TABLE followup_step_runs DROP CONSTRAINT followup_step_runs_enrollment_id_fkey;
ALTER TABLE leads DROP CONSTRAINT leads_contact_id_fkey;
ALTER TABLE message_status_events DROP CONSTRAINT message_status_events_message_id_fkey;
ALTER TABLE messages DROP CONSTRAINT messages_contact_id_fkey,
                     DROP CONSTRAINT messages_number_id_fkey;
ALTER TABLE rule_pending_executions DROP CONSTRAINT rule_pending_executions_contact_id_fkey,
                                    DROP CONSTRAINT rule_pending_executions_rule_id_fkey;
ALTER TABLE rule_runs DROP CONSTRAINT rule_runs_rule_id_fkey,
                      DROP CONSTRAINT rule_runs_trigger_id_fkey;
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_rule_id_fkey;

-- 3. The keys, project first.
ALTER TABLE activities DROP CONSTRAINT activities_pkey,
    ADD CONSTRAINT activities_pkey PRIMARY KEY (project_id, id);
ALTER TABLE ai_budget_ledger DROP CONSTRAINT ai_budget_ledger_pkey,
    ADD CONSTRAINT ai_budget_ledger_pkey PRIMARY KEY (project_id, id);
ALTER TABLE contacts DROP CONSTRAINT contacts_pkey,
    ADD CONSTRAINT contacts_pkey PRIMARY KEY (project_id, id);
ALTER TABLE followup_bulk_job_items DROP CONSTRAINT followup_bulk_job_items_pkey,
    ADD CONSTRAINT followup_bulk_job_items_pkey PRIMARY KEY (project_id, job_id, position);
ALTER TABLE followup_bulk_jobs DROP CONSTRAINT followup_bulk_jobs_pkey,
    ADD CONSTRAINT followup_bulk_jobs_pkey PRIMARY KEY (project_id, id);
ALTER TABLE followup_enrollments DROP CONSTRAINT followup_enrollments_pkey,
    ADD CONSTRAINT followup_enrollments_pkey PRIMARY KEY (project_id, id);
ALTER TABLE followup_instance_pacing DROP CONSTRAINT followup_instance_pacing_pkey,
    ADD CONSTRAINT followup_instance_pacing_pkey PRIMARY KEY (project_id, number_id);
ALTER TABLE followup_sequence_versions DROP CONSTRAINT followup_sequence_versions_pkey,
    DROP CONSTRAINT followup_sequence_versions_number_key,
    ADD CONSTRAINT followup_sequence_versions_pkey PRIMARY KEY (project_id, id),
    ADD CONSTRAINT followup_sequence_versions_number_key UNIQUE (project_id, sequence_id, version);
ALTER TABLE followup_sequences DROP CONSTRAINT followup_sequences_pkey,
    ADD CONSTRAINT followup_sequences_pkey PRIMARY KEY (project_id, id);
ALTER TABLE followup_step_runs DROP CONSTRAINT followup_step_runs_pkey,
    ADD CONSTRAINT followup_step_runs_pkey PRIMARY KEY (project_id, enrollment_id, step_index);
ALTER TABLE followup_triggers DROP CONSTRAINT followup_triggers_pkey,
    ADD CONSTRAINT followup_triggers_pkey PRIMARY KEY (project_id, id);
ALTER TABLE message_counters DROP CONSTRAINT message_counters_pkey,
    ADD CONSTRAINT message_counters_pkey PRIMARY KEY (project_id, kind, owner_id, shard);
ALTER TABLE message_status_events DROP CONSTRAINT message_status_events_pkey,
    ADD CONSTRAINT message_status_events_pkey PRIMARY KEY (project_id, id);
ALTER TABLE messages DROP CONSTRAINT messages_pkey,
    ADD CONSTRAINT messages_pkey PRIMARY KEY (project_id, id);
ALTER TABLE numbers DROP CONSTRAINT numbers_pkey,
    ADD CONSTRAINT numbers_pkey PRIMARY KEY (project_id, id);
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey,
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (project_id, id);
ALTER TABLE rule_pending_executions DROP CONSTRAINT rule_pending_executions_pkey,
    DROP CONSTRAINT rule_pending_executions_episode_key,
    ADD CONSTRAINT rule_pending_executions_pkey PRIMARY KEY (project_id, id),
    ADD CONSTRAINT rule_pending_executions_episode_key UNIQUE (project_id, rule_id, conversation_id, episode_key);
ALTER TABLE rule_runs DROP CONSTRAINT rule_runs_pkey,
    ADD CONSTRAINT rule_runs_pkey PRIMARY KEY (project_id, trigger_id, rule_id);
ALTER TABLE rules DROP CONSTRAINT rules_pkey,
    ADD CONSTRAINT rules_pkey PRIMARY KEY (project_id, id);
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_pkey,
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (project_id, id);

-- One live enrollment per sequence and contact, within the project.
DROP INDEX followup_enrollments_one_live_idx;
CREATE UNIQUE INDEX followup_enrollments_one_live_idx ON followup_enrollments (project_id, sequence_id, contact_id)
    WHERE status IN ('active', 'paused') AND sequence_id IS NOT NULL;

-- A provider's webhook names only its number (the URL set at the provider): the channel is found by the
-- number's id across projects, through a plain index now (a number's id is a random uuid, and the channel's
-- key is (project_id, number_id)).
DROP INDEX channel_numbers_number_idx;
CREATE INDEX channel_numbers_number_idx ON channel_numbers (number_id);

-- 4. The foreign keys again, each within its project (setting null clears only the id column).
ALTER TABLE activities ADD CONSTRAINT activities_contact_id_fkey
    FOREIGN KEY (project_id, contact_id) REFERENCES contacts (project_id, id) ON DELETE CASCADE;
ALTER TABLE channel_numbers ADD CONSTRAINT channel_numbers_number_id_fkey
    FOREIGN KEY (project_id, number_id) REFERENCES numbers (project_id, id) ON DELETE CASCADE;
ALTER TABLE conversations ADD CONSTRAINT conversations_contact_id_fkey
    FOREIGN KEY (project_id, contact_id) REFERENCES contacts (project_id, id) ON DELETE CASCADE;
ALTER TABLE conversations ADD CONSTRAINT conversations_number_id_fkey
    FOREIGN KEY (project_id, number_id) REFERENCES numbers (project_id, id) ON DELETE SET NULL (number_id);
ALTER TABLE deals ADD CONSTRAINT deals_contact_id_fkey
    FOREIGN KEY (project_id, contact_id) REFERENCES contacts (project_id, id) ON DELETE CASCADE;
ALTER TABLE followup_bulk_job_items ADD CONSTRAINT followup_bulk_job_items_job_id_fkey
    FOREIGN KEY (project_id, job_id) REFERENCES followup_bulk_jobs (project_id, id) ON DELETE CASCADE;
ALTER TABLE followup_bulk_jobs ADD CONSTRAINT followup_bulk_jobs_sequence_id_fkey
    FOREIGN KEY (project_id, sequence_id) REFERENCES followup_sequences (project_id, id) ON DELETE CASCADE;
ALTER TABLE followup_campaigns ADD CONSTRAINT followup_campaigns_sequence_id_fkey
    FOREIGN KEY (project_id, sequence_id) REFERENCES followup_sequences (project_id, id) ON DELETE CASCADE;
ALTER TABLE followup_enrollments ADD CONSTRAINT followup_enrollments_contact_id_fkey
    FOREIGN KEY (project_id, contact_id) REFERENCES contacts (project_id, id) ON DELETE CASCADE;
ALTER TABLE followup_enrollments ADD CONSTRAINT followup_enrollments_sequence_id_fkey
    FOREIGN KEY (project_id, sequence_id) REFERENCES followup_sequences (project_id, id)
    ON DELETE SET NULL (sequence_id);
ALTER TABLE followup_enrollments ADD CONSTRAINT followup_enrollments_version_id_fkey
    FOREIGN KEY (project_id, version_id) REFERENCES followup_sequence_versions (project_id, id);
ALTER TABLE followup_instance_pacing ADD CONSTRAINT followup_instance_pacing_number_id_fkey
    FOREIGN KEY (project_id, number_id) REFERENCES numbers (project_id, id) ON DELETE CASCADE;
ALTER TABLE followup_sequence_versions ADD CONSTRAINT followup_sequence_versions_sequence_id_fkey
    FOREIGN KEY (project_id, sequence_id) REFERENCES followup_sequences (project_id, id) ON DELETE CASCADE;
ALTER TABLE followup_sequences ADD CONSTRAINT followup_sequences_current_version_fkey
    FOREIGN KEY (project_id, current_version_id) REFERENCES followup_sequence_versions (project_id, id);
ALTER TABLE followup_step_runs ADD CONSTRAINT followup_step_runs_enrollment_id_fkey
    FOREIGN KEY (project_id, enrollment_id) REFERENCES followup_enrollments (project_id, id) ON DELETE CASCADE;
ALTER TABLE leads ADD CONSTRAINT leads_contact_id_fkey
    FOREIGN KEY (project_id, contact_id) REFERENCES contacts (project_id, id) ON DELETE CASCADE;
ALTER TABLE message_status_events ADD CONSTRAINT message_status_events_message_id_fkey
    FOREIGN KEY (project_id, message_id) REFERENCES messages (project_id, id) ON DELETE CASCADE;
ALTER TABLE messages ADD CONSTRAINT messages_contact_id_fkey
    FOREIGN KEY (project_id, contact_id) REFERENCES contacts (project_id, id) ON DELETE CASCADE;
ALTER TABLE messages ADD CONSTRAINT messages_number_id_fkey
    FOREIGN KEY (project_id, number_id) REFERENCES numbers (project_id, id) ON DELETE SET NULL (number_id);
ALTER TABLE rule_pending_executions ADD CONSTRAINT rule_pending_executions_contact_id_fkey
    FOREIGN KEY (project_id, contact_id) REFERENCES contacts (project_id, id) ON DELETE SET NULL (contact_id);
ALTER TABLE rule_pending_executions ADD CONSTRAINT rule_pending_executions_rule_id_fkey
    FOREIGN KEY (project_id, rule_id) REFERENCES rules (project_id, id) ON DELETE CASCADE;
ALTER TABLE rule_runs ADD CONSTRAINT rule_runs_rule_id_fkey
    FOREIGN KEY (project_id, rule_id) REFERENCES rules (project_id, id) ON DELETE CASCADE;
ALTER TABLE rule_runs ADD CONSTRAINT rule_runs_trigger_id_fkey
    FOREIGN KEY (project_id, trigger_id) REFERENCES followup_triggers (project_id, id) ON DELETE CASCADE;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_rule_id_fkey
    FOREIGN KEY (project_id, rule_id) REFERENCES rules (project_id, id) ON DELETE SET NULL (rule_id);

-- 5. The message counters' trigger writes each count under its project.
DROP FUNCTION message_counter_deltas(messages, integer);
CREATE FUNCTION message_counter_deltas(changed messages, sign integer)
RETURNS TABLE (project_id uuid, kind text, owner_id uuid, shard smallint, delta integer)
LANGUAGE sql IMMUTABLE AS $$
    SELECT changed.project_id, 'number_in_flight', changed.number_id, (hashtext(changed.id::text) & 15)::smallint,
           sign
    WHERE changed.status IN ('QUEUED', 'PROCESSING') AND changed.source = 'followup'
      AND changed.number_id IS NOT NULL
    UNION ALL
    SELECT changed.project_id, 'project_queued', changed.project_id, (hashtext(changed.id::text) & 15)::smallint,
           sign
    WHERE changed.status = 'QUEUED'
$$;

CREATE OR REPLACE FUNCTION count_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO message_counters AS mc (project_id, kind, owner_id, shard, messages)
        SELECT d.project_id, d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM new_rows n, message_counter_deltas(n, 1) d
        GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (project_id, kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO message_counters AS mc (project_id, kind, owner_id, shard, messages)
        SELECT d.project_id, d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM (SELECT d.* FROM new_rows n, message_counter_deltas(n, 1) d
              UNION ALL
              SELECT d.* FROM old_rows o, message_counter_deltas(o, -1) d) d
        GROUP BY 1, 2, 3, 4 HAVING sum(d.delta) <> 0 ORDER BY 1, 2, 3, 4
        ON CONFLICT (project_id, kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    ELSE
        INSERT INTO message_counters AS mc (project_id, kind, owner_id, shard, messages)
        SELECT d.project_id, d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM old_rows o, message_counter_deltas(o, -1) d
        GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (project_id, kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    END IF;
    RETURN NULL;
END
$$;

-- 6. Retention deletes project by project (each delete routed to its project's shard): each walks its
--    project's part of the index of what is past its time.
DROP INDEX followup_enrollments_finished_idx;
CREATE INDEX followup_enrollments_finished_idx ON followup_enrollments (project_id, finished_at)
    WHERE finished_at IS NOT NULL;
DROP INDEX followup_triggers_processed_idx;
CREATE INDEX followup_triggers_processed_idx ON followup_triggers (project_id, processed_at)
    WHERE processed_at IS NOT NULL;
DROP INDEX rule_pending_executions_done_idx;
CREATE INDEX rule_pending_executions_done_idx ON rule_pending_executions (project_id, updated_at)
    WHERE status <> 'pending';
DROP INDEX followup_bulk_jobs_finished_idx;
CREATE INDEX followup_bulk_jobs_finished_idx ON followup_bulk_jobs (project_id, finished_at)
    WHERE status IN ('completed', 'cancelled', 'failed');
DROP INDEX webhook_deliveries_done_idx;
CREATE INDEX webhook_deliveries_done_idx ON webhook_deliveries (project_id, updated_at) WHERE status <> 'pending';
DROP INDEX outbox_published_idx;
CREATE INDEX outbox_published_idx ON outbox (project_id, published_at) WHERE published_at IS NOT NULL;
