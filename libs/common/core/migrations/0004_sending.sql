-- Sending constraints (issue: send window, consent, the WhatsApp service window, number choice, pacing,
-- in-flight window, quotas, per-contact cap).

ALTER TABLE followup_settings
    ADD COLUMN service_window          text NOT NULL DEFAULT 'off' CHECK (service_window IN ('off', 'enforced')),
    ADD COLUMN max_in_flight_per_number integer CHECK (max_in_flight_per_number > 0),
    ADD COLUMN monthly_message_quota   integer CHECK (monthly_message_quota > 0),
    ADD COLUMN max_send_lane_backlog   integer CHECK (max_send_lane_backlog > 0);

ALTER TABLE numbers
    ADD COLUMN name        text,
    ADD COLUMN updated_at  timestamptz NOT NULL DEFAULT now();

-- a message sent as an approved WhatsApp template (outside the 24-hour service window)
ALTER TABLE messages
    ADD COLUMN template_name        text,
    ADD COLUMN template_language    text,
    ADD COLUMN template_parameters  jsonb;
-- the in-flight window: follow-ups still QUEUED or PROCESSING on a number
CREATE INDEX messages_in_flight_number_idx ON messages (number_id)
    WHERE status IN ('QUEUED', 'PROCESSING') AND source = 'followup';
-- the send-lane backlog of a project
CREATE INDEX messages_queued_project_idx ON messages (project_id, priority, created_at) WHERE status = 'QUEUED';

-- why a live enrollment is waiting (send_window, pacing, quota, ...), and when its current step was
-- scheduled: deferrals move next_run_at, never step_due_at, so the release lag shows them
ALTER TABLE followup_enrollments
    ADD COLUMN waiting_reason  text,
    ADD COLUMN step_due_at     timestamptz;
UPDATE followup_enrollments SET step_due_at = next_run_at WHERE status IN ('active', 'paused');

-- messages queued per project and month, in a few shards so concurrent releases do not queue on one row
CREATE TABLE usage_counters (
    project_id  uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    month       date NOT NULL,
    shard       smallint NOT NULL,
    messages    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, month, shard)
);
