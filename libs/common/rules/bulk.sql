-- name: by_idempotency_key
-- The job a create with this Idempotency-Key made before.
SELECT id FROM followup_bulk_jobs WHERE project_id = %(project_id)s AND idempotency_key = %(key)s

-- name: insert_job
-- A new job (queued); its contacts follow.
INSERT INTO followup_bulk_jobs (project_id, sequence_id, segment, variables, anchor_at, anchor_attribute,
                                idempotency_key, created_at, updated_at)
VALUES (%(project_id)s, %(sequence_id)s, %(segment)s, %(variables)s, %(anchor_at)s, %(anchor_attribute)s,
        %(idempotency_key)s, %(now)s, %(now)s)
ON CONFLICT (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: set_total
-- How many contacts the job holds, once they are in.
UPDATE followup_bulk_jobs
SET total = (SELECT count(*) FROM followup_bulk_job_items WHERE project_id = %(project_id)s AND job_id = %(id)s)
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: get_job
-- One job of a project.
SELECT id, sequence_id, status, total, processed, enrolled, skipped, segment, variables, anchor_at,
       anchor_attribute, cancel_requested, error, created_at, updated_at, finished_at
FROM followup_bulk_jobs
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: list_jobs
-- A page of a project's jobs, oldest first.
SELECT id, sequence_id, status, total, processed, enrolled, skipped, segment, variables, anchor_at,
       anchor_attribute, cancel_requested, error, created_at, updated_at, finished_at
FROM followup_bulk_jobs
WHERE project_id = %(project_id)s
  AND (%(after)s::uuid IS NULL
       OR (created_at, id) > (SELECT a.created_at, a.id FROM followup_bulk_jobs a
                             WHERE a.project_id = %(project_id)s AND a.id = %(after)s::uuid))
ORDER BY created_at, id
LIMIT %(limit)s

-- name: request_cancel
-- Ask a job to stop at its next chunk (a finished job stays as it is).
UPDATE followup_bulk_jobs SET cancel_requested = true, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s AND status IN ('queued', 'running')

-- name: next_jobs
-- The unfinished jobs in turns across projects (read without locks; each is then locked by lock_job): the
-- project whose open jobs moved least recently, then its job that moved least recently (each chunk moves
-- its job's updated_at), so jobs take turns a chunk at a time and a project's hundred jobs do not keep
-- another's one waiting. A few candidates: a job another worker holds is passed over for the next.
WITH turn AS (
    SELECT project_id, max(updated_at) AS moved FROM followup_bulk_jobs
    WHERE status IN ('queued', 'running')
    GROUP BY project_id
)
SELECT j.project_id, j.id
FROM followup_bulk_jobs j
JOIN turn ON turn.project_id = j.project_id
WHERE j.status IN ('queued', 'running')
ORDER BY turn.moved, j.updated_at, j.created_at, j.id
LIMIT %(candidates)s

-- name: lock_job
-- A candidate job, locked for the chunk if no other worker holds it and it is still unfinished (one worker
-- at a time moves a job on; a worker that dies releases it with its transaction). One project: routed to
-- one shard.
SELECT id, project_id, sequence_id, variables, anchor_at, anchor_attribute, cursor, total, processed,
       enrolled, skipped, cancel_requested, progress_at
FROM followup_bulk_jobs
WHERE project_id = %(project_id)s AND id = %(id)s AND status IN ('queued', 'running')
FOR UPDATE SKIP LOCKED

-- name: next_items
-- The job's next chunk of contacts after its cursor.
SELECT position, contact_id, phone FROM followup_bulk_job_items
WHERE project_id = %(project_id)s AND job_id = %(job_id)s AND position > %(cursor)s
ORDER BY position
LIMIT %(limit)s

-- name: contacts_by_phone
-- The project's contacts with these phones.
SELECT phone, id FROM contacts WHERE project_id = %(project_id)s AND phone = ANY(%(phones)s)

-- name: anchors
-- The anchor each contact holds in a custom attribute (ISO 8601 text).
SELECT id, attributes ->> %(key)s::text FROM contacts WHERE project_id = %(project_id)s AND id = ANY(%(ids)s)

-- name: record_items
-- The chunk's skipped contacts, with the reason. An enrolled contact is not written: every item up to the
-- job's cursor without an outcome was enrolled (item_outcomes), so a clean chunk updates no item row.
UPDATE followup_bulk_job_items i SET outcome = 'skipped', reason = r.reason
FROM jsonb_to_recordset(%(items)s::jsonb) AS r(position bigint, reason text)
WHERE i.project_id = %(project_id)s AND i.job_id = %(job_id)s AND i.position = r.position

-- name: item_outcomes
-- Each contact's outcome, in order: skipped (with the reason) as recorded, enrolled if the job's cursor
-- passed it without one, none if not reached yet.
SELECT i.position, i.contact_id, i.phone,
       coalesce(i.outcome, CASE WHEN i.position <= j.cursor THEN 'enrolled' END) AS outcome, i.reason
FROM followup_bulk_job_items i
JOIN followup_bulk_jobs j ON j.project_id = i.project_id AND j.id = i.job_id
WHERE i.project_id = %(project_id)s AND i.job_id = %(job_id)s
ORDER BY i.position

-- name: advance
-- The job after a chunk: its cursor, counts and status.
UPDATE followup_bulk_jobs
SET cursor = %(cursor)s, processed = %(processed)s, enrolled = %(enrolled)s, skipped = %(skipped)s,
    skipped_count = %(skipped_count)s, status = %(status)s, progress_at = %(progress_at)s,
    finished_at = CASE WHEN %(status)s IN ('completed', 'cancelled') THEN %(now)s::timestamptz END,
    updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: skipped_items
-- The contacts a job skipped, with the reason, in order.
SELECT i.position, i.contact_id, i.phone, i.reason
FROM followup_bulk_job_items i
WHERE i.project_id = %(project_id)s AND i.job_id = %(job_id)s AND i.outcome = 'skipped'
ORDER BY i.position
