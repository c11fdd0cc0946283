-- name: failed_step
-- The step run a failed follow-up message was sent for, locked, with what its template's parameters are
-- rendered from (the enrollment's variables and anchor, the contact, the project's zone) and what the
-- failed message was (a template already, its number and conversation).
SELECT r.enrollment_id, r.step_index, e.version_id, e.sequence_id, e.campaign_id, e.variables, e.anchor_at,
       m.template_name IS NOT NULL AS was_template, m.number_id, m.conversation_id, m.contact_id,
       c.name, c.phone, c.attributes, c.timezone, p.timezone AS project_timezone
FROM messages m
JOIN followup_step_runs r ON r.project_id = m.project_id AND r.enrollment_id = m.followup_enrollment_id
                          AND r.step_index = m.followup_step_index AND r.message_id = m.id
JOIN followup_enrollments e ON e.project_id = m.project_id AND e.id = m.followup_enrollment_id
JOIN contacts c ON c.project_id = m.project_id AND c.id = m.contact_id
JOIN projects p ON p.id = m.project_id
WHERE m.project_id = %(project_id)s AND m.id = %(message_id)s
FOR UPDATE OF r

-- name: rerun_step
-- The step run now stands for its retry (its message and reason), or is skipped (its message kept: the one
-- that failed).
UPDATE followup_step_runs SET outcome = %(outcome)s, reason = %(reason)s, message_id = %(new_message_id)s
WHERE project_id = %(project_id)s AND enrollment_id = %(enrollment_id)s AND step_index = %(step_index)s
