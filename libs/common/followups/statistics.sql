-- name: enrollments_by_status
-- A sequence's enrollments counted by status, reason and the step they are at (a stopped enrollment's step
-- is the one it was waiting for: that step never ran for it).
SELECT status, reason, step_index, count(*)::int
FROM followup_enrollments
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s
GROUP BY status, reason, step_index

-- name: step_outcomes
-- A sequence's step runs counted by step, outcome and reason, and a queued step's message by its latest
-- status (NULL: the message was deleted since, with its erased contact or by retention).
SELECT r.step_index, r.outcome, r.reason, m.status, count(*)::int
FROM followup_step_runs r
JOIN followup_enrollments e ON e.project_id = r.project_id AND e.id = r.enrollment_id
LEFT JOIN messages m ON m.project_id = r.project_id AND m.id = r.message_id
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s
GROUP BY r.step_index, r.outcome, r.reason, m.status

-- name: replies_after_step
-- Per step: its messages the contact was sent (the send lane reported SENT, DELIVERED or READ, and not
-- FAILED since) that the contact answered: an inbound message after the first such report and before the
-- next sent follow-up of this sequence to the contact (the enrollment's next step, or the first step of a
-- later enrollment after a re-entry), so one reply is counted once, for the message it answers.
WITH sent AS (
    SELECT r.step_index, e.contact_id,
           (SELECT min(s.occurred_at) FROM message_status_events s
            WHERE s.message_id = m.id AND s.project_id = m.project_id
              AND s.status IN ('SENT', 'DELIVERED', 'READ')) AS sent_at
    FROM followup_step_runs r
    JOIN followup_enrollments e ON e.project_id = r.project_id AND e.id = r.enrollment_id
    JOIN messages m ON m.project_id = r.project_id AND m.id = r.message_id
    WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND r.outcome = 'queued'
      AND m.status IN ('SENT', 'DELIVERED', 'READ')
), answerable AS (
    SELECT step_index, contact_id, sent_at,
           lead(sent_at) OVER (PARTITION BY contact_id ORDER BY sent_at) AS next_sent_at
    FROM sent
)
SELECT a.step_index, count(*)::int
FROM answerable a
WHERE EXISTS (
    SELECT 1 FROM messages i
    WHERE i.project_id = %(project_id)s AND i.contact_id = a.contact_id AND i.direction = 'inbound'
      AND i.created_at > a.sent_at AND i.created_at < coalesce(a.next_sent_at, 'infinity')
)
GROUP BY a.step_index

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
-- enrollments completed, stopped, converted and exited.
SELECT 'enrolled' AS kind, (e.enrolled_at AT TIME ZONE 'UTC')::date AS day, count(*)::int
FROM followup_enrollments e
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND e.enrolled_at >= %(since)s
GROUP BY 1, 2
UNION ALL
SELECT r.outcome, (r.ran_at AT TIME ZONE 'UTC')::date, count(*)::int
FROM followup_step_runs r
JOIN followup_enrollments e ON e.project_id = r.project_id AND e.id = r.enrollment_id
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND r.ran_at >= %(since)s
GROUP BY 1, 2
UNION ALL
SELECT e.status, (e.finished_at AT TIME ZONE 'UTC')::date, count(*)::int
FROM followup_enrollments e
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND e.finished_at >= %(since)s
  AND e.status IN ('completed', 'stopped', 'converted', 'exited')
GROUP BY 1, 2

-- name: template_messages_by_month
-- A sequence's template messages the provider took (SENT, DELIVERED or READ: what it charges), counted by
-- UTC month and by category (the step's, else its version's, else marketing).
SELECT to_char(m.created_at AT TIME ZONE 'UTC', 'YYYY-MM') AS month,
       coalesce(v.definition -> 'steps' -> r.step_index ->> 'category', v.definition ->> 'category',
                'marketing') AS category,
       count(*)::int
FROM followup_step_runs r
JOIN followup_enrollments e ON e.project_id = r.project_id AND e.id = r.enrollment_id
JOIN followup_sequence_versions v ON v.project_id = e.project_id AND v.id = e.version_id
JOIN messages m ON m.project_id = r.project_id AND m.id = r.message_id
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND r.outcome = 'queued'
  AND m.template_name IS NOT NULL AND m.status IN ('SENT', 'DELIVERED', 'READ')
GROUP BY 1, 2
ORDER BY 1, 2

-- name: paths
-- Per control step (branch, wait for a reply, split) and path it took (its branched step run's reason): the
-- enrollments that took it, and of those the ones with a follow-up queued at a later step, the ones that
-- replied (stopped by a reply, or took a reply path) and the ones converted (live or late).
SELECT r.step_index, r.reason, count(*)::int AS entered,
       count(*) FILTER (WHERE EXISTS (
           SELECT 1 FROM followup_step_runs s
           WHERE s.project_id = r.project_id AND s.enrollment_id = r.enrollment_id
             AND s.step_index > r.step_index AND s.outcome = 'queued'))::int AS sent,
       count(*) FILTER (WHERE (e.status = 'stopped' AND e.reason = 'replied')
                           OR e.reply_taken_at IS NOT NULL)::int AS replied,
       count(*) FILTER (WHERE e.converted_at IS NOT NULL)::int AS converted
FROM followup_step_runs r
JOIN followup_enrollments e ON e.project_id = r.project_id AND e.id = r.enrollment_id
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s AND r.outcome = 'branched'
GROUP BY r.step_index, r.reason
ORDER BY r.step_index, r.reason
LIMIT 1000

-- name: experiments
-- Per experiment and variant (or holdout) the enrollments assigned it (followup_enrollments.assignments),
-- and of those the ones with a follow-up queued after the split (its step in the enrollment's version), the
-- ones that replied (stopped by a reply, or took a reply path) and the ones converted (live or late).
WITH splits AS (
    SELECT v.id AS version_id, s.step ->> 'experiment' AS experiment, (s.position - 1)::int AS step_index
    FROM followup_sequence_versions v
    CROSS JOIN LATERAL jsonb_array_elements(v.definition -> 'steps') WITH ORDINALITY AS s(step, position)
    WHERE v.project_id = %(project_id)s AND v.sequence_id = %(sequence_id)s AND s.step ->> 'kind' = 'split'
)
SELECT a.experiment, a.variant, count(*)::int AS assigned,
       count(*) FILTER (WHERE EXISTS (
           SELECT 1 FROM followup_step_runs r
           WHERE r.project_id = e.project_id AND r.enrollment_id = e.id
             AND r.step_index > sp.step_index AND r.outcome = 'queued'))::int AS sent,
       count(*) FILTER (WHERE (e.status = 'stopped' AND e.reason = 'replied')
                           OR e.reply_taken_at IS NOT NULL)::int AS replied,
       count(*) FILTER (WHERE e.converted_at IS NOT NULL)::int AS converted
FROM followup_enrollments e
CROSS JOIN LATERAL jsonb_each_text(e.assignments) AS a(experiment, variant)
LEFT JOIN splits sp ON sp.version_id = e.version_id AND sp.experiment = a.experiment
WHERE e.project_id = %(project_id)s AND e.sequence_id = %(sequence_id)s
  AND jsonb_typeof(e.assignments) = 'object'
GROUP BY a.experiment, a.variant
ORDER BY a.experiment, a.variant
LIMIT 1000

-- name: winners
-- The winner chosen for each of the sequence's experiments.
SELECT experiment, variant, version_id, chosen_at
FROM followup_experiment_winners
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s
LIMIT 1000

-- name: conversions
-- The sequence's converted enrollments (live ones ended converted, finished ones converted late: one column,
-- so each counts once) by goal and by the step the conversion is attributed to.
SELECT goal, converted_step, count(*)::int
FROM followup_enrollments
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s AND converted_at IS NOT NULL
GROUP BY goal, converted_step
ORDER BY goal, converted_step
LIMIT 1000
