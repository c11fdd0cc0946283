-- name: by_dedupe_key
-- The enrollment holding a dedupe key in a project.
SELECT *
FROM followup_enrollments
WHERE project_id = %(project_id)s AND dedupe_key = %(dedupe_key)s

-- name: enrollment_contact
-- The contact (not erased) and whether it opted out; whether the number and conversation belong to it;
-- the project's plan limit; and the sequence's status and the version new enrollments pin (one round trip).
SELECT c.opted_out_at IS NOT NULL,
       EXISTS (SELECT 1 FROM numbers n WHERE n.project_id = c.project_id AND n.id = %(number_id)s),
       EXISTS (SELECT 1 FROM conversations v
               WHERE v.project_id = c.project_id AND v.id = %(conversation_id)s AND v.contact_id = c.id),
       p.max_active_enrollments,
       s.id IS NOT NULL AS sequence_found, s.status AS sequence_status, s.current_version_id
FROM contacts c
JOIN projects p ON p.id = c.project_id
LEFT JOIN followup_sequences s ON s.project_id = c.project_id AND s.id = %(sequence_id)s::uuid
WHERE c.project_id = %(project_id)s AND c.id = %(contact_id)s AND c.erased_at IS NULL

-- name: enrolled_before
-- Whether the contact was ever enrolled in the sequence (re-entry policy never).
SELECT 1 FROM followup_enrollments
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND sequence_id = %(sequence_id)s
LIMIT 1

-- name: serialise_reentry
-- Re-entry policy always: one enrollment of a contact into a sequence at a time. Without it, two that
-- start together both find the same live enrollment (or none), and the second's insert meets the first's
-- new live one: a 409 where the policy promises a replacement. Taken before the live one is read, so
-- the second reads (in a new statement snapshot) the enrollment the first created, and replaces it.
SELECT pg_advisory_xact_lock(hashtextextended(%(contact_id)s::text || '/' || %(sequence_id)s::text, 0))

-- name: lock_live_in_sequence
-- Re-entry policy always: the contact's live enrollment in the sequence, locked (the new one replaces it).
SELECT id, sequence_id, contact_id
FROM followup_enrollments
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND sequence_id = %(sequence_id)s
  AND status IN ('active', 'paused')
FOR UPDATE

-- name: lock_project_and_count_live
-- Lock the project (serialising its enrollments) and count its live enrollments. NO KEY UPDATE: it does
-- not block the foreign key checks of the rows releases insert, which reference the project.
SELECT (SELECT count(*) FROM followup_enrollments
        WHERE project_id = %(project_id)s AND status IN ('active', 'paused'))
FROM projects p WHERE p.id = %(project_id)s
FOR NO KEY UPDATE

-- name: insert_enrollment
-- Enroll a contact in a pinned version, with the stop flags copied from it; nothing on a known dedupe key.
INSERT INTO followup_enrollments (
    project_id, sequence_id, version_id, contact_id, conversation_id, number_id, source, campaign_id, next_run_at,
    step_due_at, anchor_at, variables, dedupe_key, stop_on_reply, stop_on_human_message, stop_on_opt_out,
    stop_on_lead_closed, stop_on_conversation_resolved, enrolled_at, updated_at
) VALUES (
    %(project_id)s, %(sequence_id)s, %(version_id)s, %(contact_id)s, %(conversation_id)s, %(number_id)s,
    %(source)s, %(campaign_id)s, %(next_run_at)s, %(next_run_at)s, %(anchor_at)s, %(variables)s, %(dedupe_key)s, %(stop_on_reply)s,
    %(stop_on_human_message)s, %(stop_on_opt_out)s, %(stop_on_lead_closed)s,
    %(stop_on_conversation_resolved)s, %(now)s, %(now)s
)
ON CONFLICT (project_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
RETURNING *

-- name: get_enrollment
-- One enrollment of a project.
SELECT *
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lock_enrollment
-- One enrollment of a project, locked for a change (a release holding it makes this wait).
SELECT *
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s
FOR UPDATE

-- name: step_runs
-- An enrollment's step runs.
SELECT r.step_index, r.outcome, r.reason, r.reason_values, r.message_id, r.due_at, r.ran_at
FROM followup_step_runs r
WHERE r.project_id = %(project_id)s AND r.enrollment_id = %(id)s
ORDER BY r.step_index

-- name: enrollment_messages
-- The messages an enrollment queued.
SELECT id, followup_step_index AS step_index, status, body, created_at
FROM messages
WHERE project_id = %(project_id)s AND followup_enrollment_id = %(id)s
ORDER BY created_at, followup_step_index

-- name: list_enrollments
-- A page of enrollments, newest first (enrolled_at, then id), after the cursor (an enrollment's id),
-- optionally by sequence, contact and status.
SELECT *
FROM followup_enrollments
WHERE project_id = %(project_id)s
  AND (%(after)s::uuid IS NULL
       OR (enrolled_at, id) < (SELECT a.enrolled_at, a.id FROM followup_enrollments a
                               WHERE a.project_id = %(project_id)s AND a.id = %(after)s::uuid))
  AND (%(sequence_id)s::uuid IS NULL OR sequence_id = %(sequence_id)s::uuid)
  AND (%(contact_id)s::uuid IS NULL OR contact_id = %(contact_id)s::uuid)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
ORDER BY enrolled_at DESC, id DESC
LIMIT %(limit)s

-- name: paused_for_a_number
-- The project's enrollments paused because no number was usable, locked.
SELECT id FROM followup_enrollments
WHERE project_id = %(project_id)s AND status = 'paused' AND reason = 'instance_unavailable'
ORDER BY id
FOR UPDATE
