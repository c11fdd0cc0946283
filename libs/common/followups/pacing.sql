-- name: lock_widening
-- A number's widened pacing, locked (its row made first when it has none: constraints' insert_pacing), with
-- the project's configured gap.
SELECT p.widened_gap_ms, p.widened_at,
       coalesce((SELECT fs.send_delay_ms FROM followup_settings fs WHERE fs.project_id = %(project_id)s), 0)
           AS send_delay_ms
FROM followup_instance_pacing p
WHERE p.project_id = %(project_id)s AND p.number_id = %(number_id)s
FOR UPDATE

-- name: widen
-- The number's pacing gap widened to %(gap_ms)s from now (its next free slot at least a gap away).
UPDATE followup_instance_pacing
SET widened_gap_ms = %(gap_ms)s, widened_at = %(now)s,
    next_release_at = greatest(next_release_at, %(next_release_at)s)
WHERE project_id = %(project_id)s AND number_id = %(number_id)s
