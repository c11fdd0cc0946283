-- name: claim_due_enrollment
-- The oldest due active enrollment whose lease is free, locked; rows locked by other workers are skipped.
SELECT id, project_id, sequence_id, version_id, contact_id, conversation_id, number_id, step_index,
       next_run_at, anchor_at, variables, enrolled_at, last_step_at, last_message_id, stop_on_reply
FROM followup_enrollments
WHERE status = 'active'
  AND next_run_at <= %(now)s
  AND (locked_until IS NULL OR locked_until <= %(now)s)
ORDER BY next_run_at
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: lock_contact
-- Share-lock the contact (a contact locked by a stop path is skipped: the releaser never waits) and read
-- what the checks, the only_if conditions and the templates need. The project row is not locked here:
-- nothing takes it FOR UPDATE (a plan-limited enrollment takes FOR NO KEY UPDATE), so the foreign key
-- checks of the rows a queued step inserts never wait for it, and the hot row is spared a lock per step.
SELECT c.opted_out_at IS NOT NULL AS opted_out,
       c.erased_at IS NOT NULL AS erased,
       c.name, c.phone, c.attributes, c.timezone,
       p.timezone AS project_timezone,
       p.plan_active,
       s.status AS sequence_status,
       (SELECT max(m.created_at) FROM messages m
        WHERE m.contact_id = c.id AND m.direction = 'inbound'
          AND m.created_at > %(enrolled_at)s) AS replied_at,
       (SELECT m.status FROM messages m WHERE m.id = %(last_message_id)s) AS last_message_status
FROM contacts c
JOIN projects p ON p.id = c.project_id
LEFT JOIN followup_sequences s ON s.id = %(sequence_id)s
WHERE c.id = %(contact_id)s
FOR SHARE OF c SKIP LOCKED

-- name: record_step_queued
-- The step run (its primary key makes a second send impossible), the followup_sent activity and the
-- followup.step_queued event.
WITH step_run AS (
    INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, reason, message_id, due_at,
                                    ran_at)
    VALUES (%(enrollment_id)s, %(step_index)s, %(project_id)s, %(outcome)s, %(reason)s, %(message_id)s,
            %(due_at)s, %(now)s)
), activity AS (
    INSERT INTO activities (project_id, contact_id, kind, data, occurred_at)
    VALUES (%(project_id)s, %(contact_id)s, 'followup_sent', %(data)s, %(now)s)
)
INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
VALUES (%(project_id)s, 'followup.step_queued', 'followup_enrollment', %(enrollment_id)s,
        %(data)s || jsonb_build_object('message_id', %(message_id)s::text), %(now)s)

-- name: record_step_skipped
-- The step run of a skipped step and the followup.step_skipped event.
WITH step_run AS (
    INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, reason, message_id, due_at,
                                    ran_at)
    VALUES (%(enrollment_id)s, %(step_index)s, %(project_id)s, %(outcome)s, %(reason)s, NULL, %(due_at)s,
            %(now)s)
)
INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
VALUES (%(project_id)s, 'followup.step_skipped', 'followup_enrollment', %(enrollment_id)s, %(data)s, %(now)s)

-- name: advance
-- Move to the next step (due at next_run_at) and remember the last follow-up message, if one was queued.
UPDATE followup_enrollments
SET step_index = %(step_index)s, next_run_at = %(next_run_at)s,
    last_message_id = coalesce(%(message_id)s, last_message_id),
    last_step_at = %(now)s, failure_count = 0, updated_at = %(now)s
WHERE id = %(id)s

-- name: pause
-- Pause an enrollment at release (its sequence is paused).
UPDATE followup_enrollments SET status = 'paused', reason = %(reason)s, updated_at = %(now)s WHERE id = %(id)s

-- name: finish
-- Finish an enrollment (completed, stopped or failed, with its reason) and write its followup.<status>
-- event. The last step's advance folds in here: step_index, last message and last step time, when given.
WITH finished AS (
    UPDATE followup_enrollments
    SET status = %(status)s, reason = %(reason)s, finished_at = %(now)s, updated_at = %(now)s,
        step_index = coalesce(%(step_index)s, step_index),
        last_message_id = coalesce(%(message_id)s, last_message_id),
        last_step_at = CASE WHEN %(step_index)s::integer IS NULL THEN last_step_at ELSE %(now)s END
    WHERE id = %(id)s
    RETURNING id, project_id, sequence_id, contact_id
)
INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
SELECT project_id, 'followup.' || %(status)s, 'followup_enrollment', id,
       jsonb_build_object('enrollment_id', id, 'sequence_id', sequence_id, 'contact_id', contact_id,
                          'reason', %(reason)s::text),
       %(now)s
FROM finished

-- name: defer
-- Try again later (the lease stays free).
UPDATE followup_enrollments SET next_run_at = %(next_run_at)s WHERE id = %(id)s

-- name: count_failure
-- Count an unexpected failure; returns the consecutive failure count.
UPDATE followup_enrollments
SET failure_count = failure_count + 1, last_error = %(error)s
WHERE id = %(id)s AND status = 'active'
RETURNING failure_count
