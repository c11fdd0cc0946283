-- Goals and exit criteria met by a platform event, in the event's own transaction (goals.py).

-- name: criteria_events
-- The events a goal or an exit of any of the project's sequence versions is about (one-off versions have
-- none): read through the versions' (project_id, sequence_id, version) key, a few rows per sequence.
SELECT DISTINCT criterion ->> 'event'
FROM followup_sequence_versions v
CROSS JOIN LATERAL jsonb_array_elements(
    coalesce(v.definition -> 'goals', '[]'::jsonb) || coalesce(v.definition -> 'exits', '[]'::jsonb)
) AS criterion
WHERE v.project_id = %(project_id)s AND v.sequence_id IS NOT NULL

-- name: candidates
-- The contact's enrollments an event may end or convert: the live ones, and the finished ones not converted
-- yet that finished inside the longest conversion window (each sequence's own is applied by the caller).
-- One indexed scan on contact_id.
SELECT id, sequence_id, contact_id, version_id, status IN ('active', 'paused') AS live,
       coalesce(last_step_at, finished_at) AS last_step_at
FROM followup_enrollments
WHERE contact_id = %(contact_id)s
  AND project_id = %(project_id)s
  AND (status IN ('active', 'paused')
       OR (converted_at IS NULL AND finished_at >= %(since)s::timestamptz))

-- name: lock_met
-- The enrollments whose goal or exit was met, locked (a release holding one makes this wait), with their
-- status as it is once locked.
SELECT id, status IN ('active', 'paused') AS live, converted_at IS NULL AS unconverted
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::uuid[])
ORDER BY id
FOR UPDATE
