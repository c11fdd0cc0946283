-- name: claim_due_enrollment
-- The oldest due active enrollment whose lease is free, locked; rows locked by other workers are skipped.
SELECT e.id, e.project_id, e.sequence_id, e.contact_id, e.number_id, e.step_index, e.next_run_at,
       e.variables, e.anchor_at, v.definition
FROM followup_enrollments e
JOIN followup_sequence_versions v ON v.id = e.version_id
WHERE e.status = 'active'
  AND e.next_run_at <= %(now)s
  AND (e.locked_until IS NULL OR e.locked_until <= %(now)s)
ORDER BY e.next_run_at
LIMIT 1
FOR UPDATE OF e SKIP LOCKED

-- name: lock_contact
-- Share-lock the contact; a contact locked by a stop path is skipped (the releaser never waits).
SELECT opted_out_at IS NOT NULL FROM contacts WHERE id = %(contact_id)s FOR SHARE SKIP LOCKED

-- name: insert_step_run
-- Record the step: the primary key (enrollment, step) makes a second send impossible.
INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, reason, message_id, due_at, ran_at)
VALUES (%(enrollment_id)s, %(step_index)s, %(project_id)s, %(outcome)s, %(reason)s, %(message_id)s,
        %(due_at)s, %(now)s)

-- name: insert_activity
-- A contact activity (followup_sent).
INSERT INTO activities (project_id, contact_id, kind, data, occurred_at)
VALUES (%(project_id)s, %(contact_id)s, %(kind)s, %(data)s, %(now)s)

-- name: advance
-- Move to the next step.
UPDATE followup_enrollments
SET step_index = %(step_index)s, next_run_at = %(next_run_at)s, last_message_id = %(message_id)s,
    last_step_at = %(now)s, failure_count = 0, updated_at = %(now)s
WHERE id = %(id)s

-- name: set_last_message
-- Remember the last follow-up message (the stop paths cancel it while still QUEUED).
UPDATE followup_enrollments SET last_message_id = %(message_id)s WHERE id = %(id)s

-- name: finish
-- Finish an enrollment: completed, stopped or failed, with its reason.
UPDATE followup_enrollments
SET status = %(status)s, reason = %(reason)s, finished_at = %(now)s, updated_at = %(now)s
WHERE id = %(id)s

-- name: defer
-- Try again later.
UPDATE followup_enrollments SET next_run_at = %(next_run_at)s, updated_at = %(now)s WHERE id = %(id)s

-- name: count_failure
-- Count an unexpected failure; returns the consecutive failure count.
UPDATE followup_enrollments
SET failure_count = failure_count + 1, last_error = %(error)s
WHERE id = %(id)s AND status = 'active'
RETURNING failure_count
