-- name: by_dedupe_key
-- The enrollment holding a dedupe key in a project.
SELECT *
FROM followup_enrollments
WHERE project_id = %(project_id)s AND dedupe_key = %(dedupe_key)s

-- name: enrollment_contact
-- The contacts of a chunk of requests, in their order (one round trip for one request or 500): each one's
-- position, whether it exists (not erased) and opted out, whether the number and conversation given with it
-- are the project's and its own, and whether it was ever enrolled in the sequence and is now; with the
-- project's plan limit and its live enrollments, and the sequence's status and the version new
-- enrollments pin.
SELECT r.n, c.id IS NOT NULL AS found, c.opted_out_at IS NOT NULL AS opted_out,
       EXISTS (SELECT 1 FROM numbers n WHERE n.project_id = %(project_id)s AND n.id = r.number_id) AS number_found,
       EXISTS (SELECT 1 FROM conversations v
               WHERE v.project_id = %(project_id)s AND v.id = r.conversation_id AND v.contact_id = c.id)
           AS conversation_found,
       EXISTS (SELECT 1 FROM followup_enrollments e
               WHERE e.project_id = %(project_id)s AND e.contact_id = c.id AND e.sequence_id = s.id)
           AS enrolled_before,
       EXISTS (SELECT 1 FROM followup_enrollments e
               WHERE e.project_id = %(project_id)s AND e.sequence_id = s.id AND e.contact_id = c.id
                 AND e.status IN ('active', 'paused'))
           AS live,
       p.max_active_enrollments,
       -- the project's live enrollments, for a plan limit only: the sum of its counter's shards (migration
       -- 0027), read after lock_project (in a statement of its own before this one) held the lock
       CASE WHEN p.max_active_enrollments IS NOT NULL THEN
           (SELECT coalesce(sum(l.live), 0) FROM followup_live_counters l WHERE l.project_id = %(project_id)s)
       END::bigint AS live_enrollments,
       s.id IS NOT NULL AS sequence_found, s.status AS sequence_status, s.current_version_id
FROM projects p
LEFT JOIN followup_sequences s ON s.project_id = %(project_id)s AND s.id = %(sequence_id)s::uuid
CROSS JOIN unnest(%(contact_ids)b::uuid[], %(number_ids)b::uuid[], %(conversation_ids)b::uuid[])
    WITH ORDINALITY AS r (contact_id, number_id, conversation_id, n)
-- each contact found by its key (a join would hash the project's every contact for a chunk of 500)
LEFT JOIN LATERAL (
    SELECT c.id, c.opted_out_at FROM contacts c
    WHERE c.project_id = %(project_id)s AND c.id = r.contact_id AND c.erased_at IS NULL
    LIMIT 1
) c ON true
WHERE p.id = %(project_id)s
ORDER BY r.n

-- name: serialise_reentry
-- Re-entry policy always: one enrollment of a contact into a sequence at a time. Without it, two that
-- start together both find the same live enrollment (or none), and the second's insert meets the first's
-- new live one: a 409 where the policy promises a replacement. Taken before the live one is read, so
-- the second reads (in a new statement snapshot) the enrollment the first created, and replaces it. The
-- contacts come sorted: every chunk takes its locks in the same order.
SELECT pg_advisory_xact_lock(hashtextextended(c::text || '/' || %(sequence_id)s::text, 0))
FROM unnest(%(contact_ids)b::uuid[]) AS c

-- name: lock_live_in_sequence
-- Re-entry policy always: the contacts' live enrollments in the sequence, locked (new ones replace them).
SELECT id, sequence_id, contact_id
FROM followup_enrollments
WHERE project_id = %(project_id)s AND contact_id = ANY(%(contact_ids)b::uuid[]) AND sequence_id = %(sequence_id)s
  AND status IN ('active', 'paused')
ORDER BY id
FOR UPDATE

-- name: lock_project
-- A project with a plan limit: its enrollments one at a time (a lock until the transaction ends), so that
-- the limit holds when they are concurrent; nothing for a project without one. An advisory lock: it writes
-- nothing, and it blocks nothing but another enrollment of the same project. Not in a preview (a session's
-- followups.preview: what it writes is rolled back, and it holds no lock a real enrollment waits for).
SELECT pg_advisory_xact_lock(hashtextextended('plan/' || p.id::text, 0))
FROM projects p WHERE p.id = %(project_id)s AND p.max_active_enrollments IS NOT NULL
  AND current_setting('followups.preview', true) IS DISTINCT FROM 'on'

-- name: insert_enrollments
-- Enroll contacts in a pinned version (one request's arrays or a chunk's), with the stop flags copied from
-- it; nothing for a contact whose dedupe key is known or who is enrolled now (a unique index: the caller
-- tells which). The project's live count gains them (migration 0027: the session's shard; not in a
-- preview, which is rolled back and must not hold a counter row a real enrollment or release waits for).
WITH enrolled AS (
    INSERT INTO followup_enrollments (
        project_id, sequence_id, version_id, contact_id, conversation_id, number_id, source, campaign_id,
        next_run_at, step_due_at, anchor_at, variables, dedupe_key, stop_on_reply, stop_on_human_message,
        stop_on_opt_out, stop_on_lead_closed, stop_on_conversation_resolved, enrolled_at, updated_at
    )
    SELECT %(project_id)s, %(sequence_id)s::uuid, %(version_id)s, r.contact_id, r.conversation_id, r.number_id,
           %(source)s::text, %(campaign_id)s::uuid, r.next_run_at, r.next_run_at, r.anchor_at, r.variables,
           r.dedupe_key, %(stop_on_reply)s, %(stop_on_human_message)s, %(stop_on_opt_out)s,
           %(stop_on_lead_closed)s, %(stop_on_conversation_resolved)s, %(now)s, %(now)s
    FROM unnest(%(contact_ids)b::uuid[], %(conversation_ids)b::uuid[], %(number_ids)b::uuid[],
                %(next_run_ats)b::timestamptz[], %(anchor_ats)b::timestamptz[], %(variables)b::jsonb[],
                %(dedupe_keys)b::text[])
        AS r (contact_id, conversation_id, number_id, next_run_at, anchor_at, variables, dedupe_key)
    ON CONFLICT DO NOTHING
    RETURNING *
), counted AS (
    INSERT INTO followup_live_counters AS c (project_id, shard, live)
    SELECT %(project_id)s, pg_backend_pid() & 15, count(*) FROM enrolled
    WHERE current_setting('followups.preview', true) IS DISTINCT FROM 'on' HAVING count(*) > 0
    ON CONFLICT (project_id, shard) DO UPDATE SET live = c.live + excluded.live
)
SELECT * FROM enrolled

-- name: get_enrollment
-- One enrollment of a project.
SELECT *
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: still_sending
-- Whether the enrollment's messages may still go: active, or completed (its last step sent); not stopped,
-- failed or paused.
SELECT 1 FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(id)s AND status IN ('active', 'completed')

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
