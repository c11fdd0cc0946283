-- Bulk enrollment (issue: resumable jobs over a list or a frozen segment) and campaign recipients.

-- the contacts of a job, in order: an explicit list (ids or phones) or the frozen set a segment matched
-- when the job was created; each gets its outcome when its chunk is processed
ALTER TABLE followup_bulk_jobs DROP CONSTRAINT IF EXISTS followup_bulk_jobs_check;
ALTER TABLE followup_bulk_jobs
    DROP COLUMN contact_ids,
    DROP CONSTRAINT followup_bulk_jobs_status_check,
    ADD COLUMN variables          jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN anchor_at          timestamptz,
    ADD COLUMN anchor_attribute   text,
    ADD COLUMN idempotency_key    text,
    ADD COLUMN total              integer NOT NULL DEFAULT 0,
    ADD COLUMN processed          integer NOT NULL DEFAULT 0,
    ADD COLUMN skipped            jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN cancel_requested   boolean NOT NULL DEFAULT false,
    ADD COLUMN progress_at        timestamptz,
    ADD COLUMN error              text,
    ADD COLUMN updated_at         timestamptz NOT NULL DEFAULT now();
ALTER TABLE followup_bulk_jobs ALTER COLUMN status SET DEFAULT 'queued';
UPDATE followup_bulk_jobs SET status = 'queued' WHERE status = 'pending';
ALTER TABLE followup_bulk_jobs
    ADD CONSTRAINT followup_bulk_jobs_status_check
        CHECK (status IN ('queued', 'running', 'completed', 'cancelled', 'failed'));
ALTER TABLE followup_bulk_jobs RENAME COLUMN rejected TO skipped_count;
-- the cursor is the position of the last contact processed
ALTER TABLE followup_bulk_jobs ALTER COLUMN cursor TYPE bigint USING NULLIF(cursor, '')::bigint;
ALTER TABLE followup_bulk_jobs ALTER COLUMN cursor SET DEFAULT 0;
UPDATE followup_bulk_jobs SET cursor = 0 WHERE cursor IS NULL;
ALTER TABLE followup_bulk_jobs ALTER COLUMN cursor SET NOT NULL;
CREATE UNIQUE INDEX followup_bulk_jobs_idempotency_idx ON followup_bulk_jobs (project_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DROP INDEX followup_bulk_jobs_open_idx;
CREATE INDEX followup_bulk_jobs_open_idx ON followup_bulk_jobs (created_at) WHERE status IN ('queued', 'running');
CREATE INDEX followup_bulk_jobs_project_idx ON followup_bulk_jobs (project_id, created_at, id);

CREATE TABLE followup_bulk_job_items (
    job_id      uuid NOT NULL REFERENCES followup_bulk_jobs (id) ON DELETE CASCADE,
    position    bigint NOT NULL,
    contact_id  uuid,
    phone       text,          -- a phone as given (resolved when its chunk is processed)
    outcome     text CHECK (outcome IN ('enrolled', 'skipped')),
    reason      text,
    PRIMARY KEY (job_id, position)
);
CREATE INDEX followup_bulk_job_items_skipped_idx ON followup_bulk_job_items (job_id, position)
    WHERE outcome = 'skipped';

-- a campaign's no-reply sequence: each released recipient is enrolled in it
CREATE TABLE followup_campaigns (
    id           uuid NOT NULL,
    project_id   uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    sequence_id  uuid NOT NULL REFERENCES followup_sequences (id) ON DELETE CASCADE,
    name         text,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (project_id, id)
);
