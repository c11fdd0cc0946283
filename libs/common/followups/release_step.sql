-- name: release_state
-- Share-lock the claimed enrollment's contact (a contact locked by a stop path is skipped: the releaser
-- never waits) and read what the checks, the only_if conditions and the templates need. The project row
-- is not locked here: nothing takes it FOR UPDATE (a plan-limited enrollment takes FOR NO KEY UPDATE), so
-- the foreign key checks of the rows a queued step inserts never wait for it, and the hot row is spared a
-- lock per step.
SELECT c.opted_out_at IS NOT NULL AS opted_out,
       c.erased_at IS NOT NULL AS erased,
       c.name, c.phone, c.attributes, c.timezone,
       p.timezone AS project_timezone,
       p.plan_active,
       s.status AS sequence_status,
       (SELECT max(m.created_at) FROM messages m
        WHERE m.contact_id = c.id AND m.direction = 'inbound'
          AND m.created_at > %(enrolled_at)s) AS replied_at,
       (SELECT m.status FROM messages m WHERE m.id = %(last_message_id)s) AS last_message_status
FROM contacts c
JOIN projects p ON p.id = c.project_id
LEFT JOIN followup_sequences s ON s.id = %(sequence_id)s
WHERE c.id = %(contact_id)s
FOR SHARE OF c SKIP LOCKED

-- name: insert_step_run
-- The step run: its primary key (enrollment, step) makes a second send of a step impossible. A queued step
-- also enters the contact's timeline (a followup_sent activity), in the same statement: the release path
-- spends no statement of its own on it.
WITH step_run AS (
    INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, reason, message_id, due_at,
                                    ran_at)
    VALUES (%(enrollment_id)s, %(step_index)s, %(project_id)s, %(outcome)s, %(reason)s, %(message_id)s,
            %(due_at)s, %(now)s)
)
INSERT INTO activities (project_id, contact_id, kind, data, occurred_at)
SELECT %(project_id)s, %(contact_id)s, 'followup_sent', %(activity)s::jsonb, %(now)s
WHERE %(activity)s::jsonb IS NOT NULL

-- name: failing_enrollment
-- What the followup.failed event of an enrollment that failed for good names.
SELECT id, project_id, sequence_id, contact_id FROM followup_enrollments WHERE id = %(id)s
