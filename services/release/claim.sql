-- name: claim_due_enrollment
-- The oldest due active enrollment whose lease is free, locked; rows locked by other workers are skipped.
SELECT id, project_id, sequence_id, version_id, contact_id, conversation_id, number_id, step_index,
       next_run_at, step_due_at, anchor_at, variables, enrolled_at, last_step_at, last_message_id, stop_on_reply,
       waiting_reason, unavailable_since
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
