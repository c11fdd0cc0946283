-- name: claim_due_enrollment
-- The oldest due active enrollment whose lease is free, locked; rows locked by other workers are skipped.
SELECT id, project_id, sequence_id, version_id, contact_id, conversation_id, number_id, step_index,
       next_run_at, step_due_at, anchor_at, variables, enrolled_at, last_step_at, last_message_id, stop_on_reply,
       waiting_reason, unavailable_since, campaign_id
FROM followup_enrollments
WHERE status = 'active'
  AND next_run_at <= %(now)s
  AND (locked_until IS NULL OR locked_until <= %(now)s)
ORDER BY next_run_at
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: next_due
-- Seconds until the earliest active enrollment not yet due falls due (NULL: none): the release loop
-- sleeps until then. The claim index's range scan from now: the due rows before it are not read.
SELECT extract(epoch FROM min(next_run_at) - %(now)s)::float8
FROM followup_enrollments
WHERE status = 'active' AND next_run_at > %(now)s

-- name: leased_step
-- What the model call of a leased AI step reads of its enrollment (without locks: the model is called
-- holding none); nothing when the enrollment is no longer at the step under the same fence.
SELECT id, project_id, contact_id, conversation_id, version_id, step_index, variables
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'active' AND step_index = %(step_index)s
  AND attempts = %(fence)s

-- name: lock_fenced
-- The AI step's enrollment for its second pass: still active, at the same step and attempts (the fence),
-- locked (a release holding it is short).
SELECT id, project_id, sequence_id, version_id, contact_id, conversation_id, number_id, step_index,
       next_run_at, step_due_at, anchor_at, variables, enrolled_at, last_step_at, last_message_id, stop_on_reply,
       waiting_reason, unavailable_since, campaign_id
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'active' AND step_index = %(step_index)s
  AND attempts = %(fence)s
FOR UPDATE
