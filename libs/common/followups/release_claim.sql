-- name: claim_due_enrollment
-- The project's oldest due active enrollment whose lease is free, locked; rows locked by other workers are
-- skipped. One project's rows only (the project-led claim index): a claim routed to one shard.
SELECT id, project_id, sequence_id, version_id, contact_id, conversation_id, number_id, step_index,
       next_run_at, step_due_at, anchor_at, variables, enrolled_at, last_step_at, last_message_id, stop_on_reply,
       waiting_reason, unavailable_since, campaign_id, reply_step, reply_taken_at
FROM followup_enrollments
WHERE project_id = %(project_id)s
  AND status = 'active'
  AND next_run_at <= %(now)s
  AND (locked_until IS NULL OR locked_until <= %(now)s)
ORDER BY project_id, next_run_at  -- the project-led index's order: never the time-led one, filtered
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: due_projects
-- The projects with a due active enrollment, in turns (jobs.RoundRobin): those after %(after)s in id order,
-- then from the first up to %(after)s (wrapping around), at most %(projects)s of them. A skip scan of the
-- project-led claim index, read without locks (each project's claim locks its own rows): one descent finds
-- the next project with an active enrollment, one more sees whether its earliest is due; a project's
-- backlog is never read. ``lap`` 0 walks the projects after %(after)s, lap 1 the first ones up to it.
WITH RECURSIVE walk(project_id, lap) AS (
    SELECT %(after)s::uuid, 0
  UNION ALL
    SELECT coalesce(n.project_id, f.project_id), w.lap + (n.project_id IS NULL)::integer
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT (SELECT e.project_id FROM followup_enrollments e
                WHERE e.status = 'active' AND e.project_id > w.project_id
                ORDER BY e.project_id, e.next_run_at LIMIT 1)
    ) n(project_id)
    CROSS JOIN LATERAL (
        SELECT CASE WHEN n.project_id IS NULL AND w.lap = 0 THEN
            (SELECT e.project_id FROM followup_enrollments e WHERE e.status = 'active'
             ORDER BY e.project_id, e.next_run_at LIMIT 1) END
    ) f(project_id)
    WHERE w.project_id IS NOT NULL AND (w.lap = 0 OR w.project_id < %(after)s)
)
SELECT w.project_id
FROM walk w
WHERE ((w.lap = 0 AND w.project_id > %(after)s) OR (w.lap = 1 AND w.project_id <= %(after)s))
  AND EXISTS (SELECT 1 FROM followup_enrollments e
              WHERE e.project_id = w.project_id AND e.status = 'active' AND e.next_run_at <= %(now)s)
LIMIT %(projects)s

-- name: next_due
-- Seconds until the earliest active enrollment not yet due falls due (NULL: none): the release loop sleeps
-- until then. The projects with active enrollments (a skip scan of the claim index), and of each its
-- earliest enrollment after now (one descent): the due rows before it are not read.
WITH RECURSIVE walk(project_id) AS (
    SELECT (SELECT e.project_id FROM followup_enrollments e WHERE e.status = 'active'
            ORDER BY e.project_id, e.next_run_at LIMIT 1)
  UNION ALL
    SELECT (SELECT e.project_id FROM followup_enrollments e
            WHERE e.status = 'active' AND e.project_id > w.project_id
            ORDER BY e.project_id, e.next_run_at LIMIT 1)
    FROM walk w WHERE w.project_id IS NOT NULL
)
SELECT extract(epoch FROM min(n.next_run_at) - %(now)s)::float8
FROM walk w
CROSS JOIN LATERAL (
    SELECT e.next_run_at FROM followup_enrollments e
    WHERE e.project_id = w.project_id AND e.status = 'active' AND e.next_run_at > %(now)s
    ORDER BY e.next_run_at LIMIT 1
) n

-- name: leased_step
-- What the model call of a leased AI step reads of its enrollment (without locks: the model is called
-- holding none); nothing when the enrollment is no longer at the step under the same fence.
SELECT id, project_id, contact_id, conversation_id, version_id, step_index, variables
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'active' AND step_index = %(step_index)s
  AND attempts = %(fence)s

-- name: lock_fenced
-- The AI step's enrollment for its second pass: still active, at the same step and attempts (the fence),
-- locked (a release holding it is short).
SELECT id, project_id, sequence_id, version_id, contact_id, conversation_id, number_id, step_index,
       next_run_at, step_due_at, anchor_at, variables, enrolled_at, last_step_at, last_message_id, stop_on_reply,
       waiting_reason, unavailable_since, campaign_id, reply_step, reply_taken_at
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'active' AND step_index = %(step_index)s
  AND attempts = %(fence)s
FOR UPDATE

-- name: enrollment_to_release
-- An active enrollment as the release step reads it, by id, whenever it falls due (a sequence's preview
-- releases the enrollment it made in its own savepoint: nobody else sees it, no lock is taken).
SELECT id, project_id, sequence_id, version_id, contact_id, conversation_id, number_id, step_index,
       next_run_at, step_due_at, anchor_at, variables, enrolled_at, last_step_at, last_message_id, stop_on_reply,
       waiting_reason, unavailable_since, campaign_id, reply_step, reply_taken_at
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'active'
