-- name: insert_sequence
-- Create a sequence with its draft definition.
WITH s AS (
    INSERT INTO followup_sequences (project_id, name, draft)
    VALUES (%(project_id)s, %(name)s, %(draft)s)
    RETURNING *
)
SELECT id, name, status, draft, current_version_id, NULL::integer AS current_version, created_at, updated_at
FROM s

-- name: update_sequence
-- Edit a sequence's name and draft.
WITH s AS (
    UPDATE followup_sequences
    SET name = coalesce(%(name)s, name), draft = coalesce(%(draft)s, draft), updated_at = now()
    WHERE project_id = %(project_id)s AND id = %(id)s
    RETURNING *
)
SELECT s.id, s.name, s.status, s.draft, s.current_version_id, v.version AS current_version, s.created_at,
       s.updated_at
FROM s LEFT JOIN followup_sequence_versions v ON v.project_id = %(project_id)s AND v.id = s.current_version_id

-- name: get_sequence
-- One sequence of a project.
SELECT s.id, s.name, s.status, s.draft, s.current_version_id, v.version AS current_version, s.created_at,
       s.updated_at
FROM followup_sequences s
LEFT JOIN followup_sequence_versions v ON v.project_id = s.project_id AND v.id = s.current_version_id
WHERE s.project_id = %(project_id)s AND s.id = %(id)s

-- name: list_sequences
-- A page of a project's sequences in id order (of one status when given; the archived ones left out when
-- neither that status nor include_archived asks for them).
SELECT s.id, s.name, s.status, s.draft, s.current_version_id, v.version AS current_version, s.created_at,
       s.updated_at
FROM followup_sequences s
LEFT JOIN followup_sequence_versions v ON v.project_id = s.project_id AND v.id = s.current_version_id
WHERE s.project_id = %(project_id)s
  AND (%(after)s::uuid IS NULL OR s.id > %(after)s::uuid)
  AND (%(status)s::text IS NULL OR s.status = %(status)s::text)
  AND (%(status)s::text IS NOT NULL OR %(include_archived)s OR s.status <> 'archived')
ORDER BY s.id
LIMIT %(limit)s

-- name: lock_sequence
-- Lock a sequence; returns its status and draft.
SELECT status, draft FROM followup_sequences
WHERE project_id = %(project_id)s AND id = %(id)s
FOR UPDATE

-- name: insert_version
-- Freeze a definition as the sequence's next version (or as a one-off version).
INSERT INTO followup_sequence_versions (project_id, sequence_id, version, definition, step_count)
VALUES (
    %(project_id)s, %(sequence_id)s,
    coalesce((SELECT max(version) FROM followup_sequence_versions
              WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s), 0) + 1,
    %(definition)s, %(step_count)s
)
RETURNING id, sequence_id, version, definition, created_at

-- name: list_versions
-- A page of a sequence's versions, newest first, without their definitions (after: the previous page's
-- last version).
SELECT id, sequence_id, version, step_count, created_at
FROM followup_sequence_versions
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s
  AND (%(after)s::uuid IS NULL
       OR version < (SELECT a.version FROM followup_sequence_versions a
                     WHERE a.project_id = %(project_id)s AND a.sequence_id = %(sequence_id)s
                       AND a.id = %(after)s::uuid))
ORDER BY version DESC
LIMIT %(limit)s

-- name: get_version
-- One of a sequence's versions by its number, with its definition.
SELECT id, sequence_id, version, definition, created_at
FROM followup_sequence_versions
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s AND version = %(version)s

-- name: latest_version_if_same
-- The sequence's latest version when its definition is the one given (publishing it again makes none).
SELECT id, sequence_id, version, definition, created_at
FROM (SELECT * FROM followup_sequence_versions
      WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s
      ORDER BY version DESC LIMIT 1) v
WHERE v.definition = %(definition)s::jsonb

-- name: set_current_version
-- Point new enrollments at a version; a draft becomes active.
UPDATE followup_sequences
SET current_version_id = %(version_id)s,
    status = CASE WHEN status = 'draft' THEN 'active' ELSE status END,
    updated_at = now()
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: set_sequence_status
-- Pause, resume or archive.
UPDATE followup_sequences SET status = %(status)s, updated_at = now()
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: paused_by_sequence
-- The enrollments the sequence's pause paused, locked (resuming or archiving it reactivates them).
SELECT id FROM followup_enrollments
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s AND status = 'paused'
  AND reason = 'sequence_paused'
FOR UPDATE

-- name: version_definition
-- The number and frozen definition of a version.
SELECT version, definition FROM followup_sequence_versions WHERE project_id = %(project_id)s AND id = %(id)s

-- name: sequence_names
-- Names of some of the project's sequences (the rows of a list).
SELECT id, name FROM followup_sequences
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::uuid[])

-- name: record_winners
-- The winners a published version's splits name, recorded (the release reads them: an enrollment on an
-- older version that reaches the split takes the winner too). The same variant again keeps when it was
-- chosen, and points at the newest version naming it.
INSERT INTO followup_experiment_winners AS w (project_id, sequence_id, experiment, variant, version_id, chosen_at)
SELECT %(project_id)s, %(sequence_id)s, x.experiment, x.variant, %(version_id)s,
       coalesce(%(now)s::timestamptz, now())
FROM unnest(%(experiments)s::text[], %(variants)s::text[]) AS x(experiment, variant)
ON CONFLICT (project_id, sequence_id, experiment) DO UPDATE
SET variant = EXCLUDED.variant,
    version_id = EXCLUDED.version_id,
    chosen_at = CASE WHEN w.variant = EXCLUDED.variant THEN w.chosen_at ELSE EXCLUDED.chosen_at END
RETURNING experiment, variant, version_id, chosen_at

-- name: clear_winners
-- The experiments a published version runs without a winner: a winner chosen before no longer holds (the
-- experiment runs again, on every version).
DELETE FROM followup_experiment_winners
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s AND experiment = ANY(%(experiments)s::text[])
