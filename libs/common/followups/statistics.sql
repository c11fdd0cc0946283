-- name: enrollments_by_status
-- A sequence's enrollments counted by status and reason.
SELECT status, reason, count(*)::int
FROM followup_enrollments
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s
GROUP BY status, reason

-- name: step_runs_by_outcome
-- A sequence's step runs counted by step, outcome and reason.
SELECT r.step_index, r.outcome, r.reason, count(*)::int
FROM followup_step_runs r
JOIN followup_enrollments e ON e.id = r.enrollment_id
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s
GROUP BY r.step_index, r.outcome, r.reason

-- name: replies_after_step
-- Per step: enrollments whose contact replied after the step's message and before the next follow-up message
-- of this sequence to the contact (the enrollment's next step, or the first step of a later enrollment after
-- a re-entry), so one reply is counted once, for the message it answers.
SELECT r.step_index, count(*)::int
FROM followup_step_runs r
JOIN followup_enrollments e ON e.id = r.enrollment_id
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND r.outcome = 'queued'
  AND EXISTS (
      SELECT 1 FROM messages m
      WHERE m.project_id = e.project_id AND m.contact_id = e.contact_id AND m.direction = 'inbound'
        AND m.created_at > r.ran_at
        AND m.created_at < coalesce(
            (SELECT min(n.ran_at)
             FROM followup_step_runs n
             JOIN followup_enrollments ne ON ne.id = n.enrollment_id
             WHERE ne.project_id = e.project_id AND ne.sequence_id = e.sequence_id
               AND ne.contact_id = e.contact_id AND n.outcome = 'queued' AND n.ran_at > r.ran_at),
            'infinity')
  )
GROUP BY r.step_index

-- name: step_count
-- The most steps any published version of the sequence has (0 before the first publish).
SELECT coalesce(max(step_count), 0)::int
FROM followup_sequence_versions
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s

-- name: enrollments_by_sequence
-- Enrollments of the given sequences counted by sequence and status (a sequence list's live counts).
SELECT sequence_id, status, count(*)::int
FROM followup_enrollments
WHERE project_id = %(project_id)s AND sequence_id = ANY(%(sequence_ids)s::uuid[])
GROUP BY sequence_id, status

-- name: daily_activity
-- A sequence's activity per UTC day from a moment on: enrollments made, step runs queued and skipped, and
-- enrollments completed and stopped.
SELECT 'enrolled' AS kind, (e.enrolled_at AT TIME ZONE 'UTC')::date AS day, count(*)::int
FROM followup_enrollments e
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND e.enrolled_at >= %(since)s
GROUP BY 1, 2
UNION ALL
SELECT r.outcome, (r.ran_at AT TIME ZONE 'UTC')::date, count(*)::int
FROM followup_step_runs r
JOIN followup_enrollments e ON e.id = r.enrollment_id
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND r.ran_at >= %(since)s
GROUP BY 1, 2
UNION ALL
SELECT e.status, (e.finished_at AT TIME ZONE 'UTC')::date, count(*)::int
FROM followup_enrollments e
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND e.finished_at >= %(since)s
  AND e.status IN ('completed', 'stopped')
GROUP BY 1, 2
