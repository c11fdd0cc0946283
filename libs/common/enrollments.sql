-- name: enrollment_target
-- The sequence's status and current version, and whether the contact exists and opted out.
SELECT s.status, s.current_version_id, v.definition, c.id IS NOT NULL, c.opted_out_at IS NOT NULL
FROM followup_sequences s
LEFT JOIN followup_sequence_versions v ON v.id = s.current_version_id
LEFT JOIN contacts c ON c.project_id = s.project_id AND c.id = %(contact_id)s AND c.erased_at IS NULL
WHERE s.project_id = %(project_id)s AND s.id = %(sequence_id)s

-- name: insert_enrollment
-- Enroll a contact in a pinned version, with the stop flags copied from it.
INSERT INTO followup_enrollments (
    project_id, sequence_id, version_id, contact_id, number_id, source, next_run_at, anchor_at, variables,
    dedupe_key, stop_on_reply, stop_on_human_message, stop_on_opt_out, stop_on_lead_closed,
    stop_on_conversation_resolved, enrolled_at, updated_at
) VALUES (
    %(project_id)s, %(sequence_id)s, %(version_id)s, %(contact_id)s, %(number_id)s, %(source)s,
    %(next_run_at)s, %(anchor_at)s, %(variables)s, %(dedupe_key)s, %(stop_on_reply)s,
    %(stop_on_human_message)s, %(stop_on_opt_out)s, %(stop_on_lead_closed)s,
    %(stop_on_conversation_resolved)s, %(now)s, %(now)s
)
RETURNING id, sequence_id, version_id, contact_id, status, source, step_index, next_run_at, anchor_at,
          variables, dedupe_key, reason, last_message_id, enrolled_at, finished_at

-- name: get_enrollment
-- One enrollment of a project.
SELECT id, sequence_id, version_id, contact_id, status, source, step_index, next_run_at, anchor_at,
       variables, dedupe_key, reason, last_message_id, enrolled_at, finished_at
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s
