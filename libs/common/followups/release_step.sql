-- name: lock_pacing
-- The number's pacing row, locked SKIP LOCKED (another release on the number holds it: busy, never wait).
SELECT next_release_at FROM followup_instance_pacing
WHERE project_id = %(project_id)s AND number_id = %(number_id)s
FOR UPDATE SKIP LOCKED

-- name: insert_pacing
-- A number's first pacing row (free now); nothing when it exists.
INSERT INTO followup_instance_pacing (number_id, project_id, next_release_at)
VALUES (%(number_id)s, %(project_id)s, %(now)s)
ON CONFLICT (project_id, number_id) DO NOTHING

-- name: set_pacing
-- The number's next free slot moves on (a follow-up was queued, or a slot reserved); never back.
UPDATE followup_instance_pacing SET next_release_at = greatest(next_release_at, %(next_release_at)s)
WHERE project_id = %(project_id)s AND number_id = %(number_id)s

-- name: failing_enrollment
-- What the followup.failed event of an enrollment that failed for good names.
SELECT id, project_id, sequence_id, contact_id FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s
