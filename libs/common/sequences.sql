-- name: insert_sequence
-- Create a sequence with its draft definition.
INSERT INTO followup_sequences (project_id, name, draft)
VALUES (%(project_id)s, %(name)s, %(draft)s)
RETURNING id, name, status, draft, current_version_id, created_at, updated_at

-- name: get_sequence
-- One sequence of a project.
SELECT id, name, status, draft, current_version_id, created_at, updated_at
FROM followup_sequences
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lock_sequence
-- Lock a sequence for publishing; returns its status and draft.
SELECT status, draft FROM followup_sequences
WHERE project_id = %(project_id)s AND id = %(id)s
FOR UPDATE

-- name: insert_version
-- Freeze a definition as the sequence's next version.
INSERT INTO followup_sequence_versions (project_id, sequence_id, version, definition, step_count)
VALUES (
    %(project_id)s, %(sequence_id)s,
    coalesce((SELECT max(version) FROM followup_sequence_versions WHERE sequence_id = %(sequence_id)s), 0) + 1,
    %(definition)s, %(step_count)s
)
RETURNING id, sequence_id, version, definition, created_at

-- name: set_current_version
-- Point new enrollments at a version; a draft becomes active.
UPDATE followup_sequences
SET current_version_id = %(version_id)s,
    status = CASE WHEN status = 'draft' THEN 'active' ELSE status END,
    updated_at = now()
WHERE id = %(id)s
