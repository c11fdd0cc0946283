-- name: schedule
-- A project's pending executions of delayed rules, one per (rule, conversation, episode): a repeated event
-- of the same episode changes nothing (the clock is not reset), except a reply chase, whose due time
-- follows the latest agent reply forward (never back). Rows go in key order, so two batches never
-- deadlock.
INSERT INTO rule_pending_executions AS e (project_id, rule_id, conversation_id, contact_id, trigger_id,
                                          episode_key, episode_kind, due_at, created_at, updated_at)
SELECT %(project_id)s, s.rule_id, s.conversation_id, s.contact_id, s.trigger_id, s.episode_key,
       s.episode_kind, s.due_at, %(now)s, %(now)s
FROM jsonb_to_recordset(%(rows)s::jsonb)
     AS s(rule_id uuid, conversation_id uuid, contact_id uuid, trigger_id bigint, episode_key text,
          episode_kind text, due_at timestamptz)
ORDER BY s.rule_id, s.conversation_id, s.episode_key
ON CONFLICT ON CONSTRAINT rule_pending_executions_episode_key DO UPDATE
SET due_at = excluded.due_at, trigger_id = excluded.trigger_id, updated_at = excluded.updated_at
WHERE e.episode_kind = 'reply_chase' AND e.status = 'pending' AND excluded.due_at > e.due_at

-- name: anchors
-- The anchors now of some of the project's conversations: an event whose episode already ended schedules
-- nothing.
SELECT v.id, v.status_changed_at, v.last_incoming_message_id, v.waiting_since
FROM conversations v
WHERE v.project_id = %(project_id)s AND v.id = ANY(%(ids)s::uuid[])

-- name: project_timezone
-- The time zone a project's business hours are in.
SELECT timezone FROM projects WHERE id = %(project_id)s

-- name: due_shares
-- The projects with pending executions in turns (jobs.RoundRobin, as the triggers' shares): those after
-- %(after)s, wrapping around, at most %(projects)s of them, and the share of the batch each may take
-- (project_shares), counted from each project's ready index (an execution is ready from the later of its
-- due time and its lease's end: a backoff is a lease), so another project's backlog or backed-off
-- executions are never read. Read without locks: each project's claim locks its own.
SELECT project_id, share
FROM project_shares('rule_pending_executions', $$q.status = 'pending'$$,
                    'greatest(q.due_at, coalesce(q.locked_until, q.due_at)) <= $1',
                    %(after)s, %(projects)s, %(limit)s, %(now)s)

-- name: claim_due
-- One project's executions ready first, up to its share of the batch, leased to this sweeper; rows locked
-- by another sweeper are skipped. One project: a claim routed to one shard.
WITH due AS (
    SELECT e.id FROM rule_pending_executions e
    WHERE e.project_id = %(project_id)s AND e.status = 'pending'
      AND greatest(e.due_at, coalesce(e.locked_until, e.due_at)) <= %(now)s
    ORDER BY greatest(e.due_at, coalesce(e.locked_until, e.due_at)), e.id
    LIMIT %(share)s
    FOR UPDATE SKIP LOCKED
)
UPDATE rule_pending_executions e SET locked_until = %(until)s
FROM due WHERE e.project_id = %(project_id)s AND e.id = due.id
RETURNING e.id, e.project_id, e.rule_id, e.trigger_id, e.attempts

-- name: lock_leased
-- One execution under this sweeper's lease, with what the guard chain needs: the rule as it is now, the
-- conversation's anchors now, and the trigger that opened the episode (nothing when another sweeper took it
-- over after the lease ran out, or it is done).
SELECT e.id, e.project_id, e.rule_id, e.conversation_id, e.contact_id, e.trigger_id, e.episode_key,
       e.episode_kind, e.due_at, e.attempts, e.created_at,
       r.id IS NOT NULL AND r.active AS rule_active,
       v.id IS NOT NULL AS conversation_exists,
       v.status_changed_at, v.last_incoming_message_id, v.waiting_since,
       t.type AS trigger_type, t.public_id AS trigger_public_id, t.payload, t.occurred_at
FROM rule_pending_executions e
LEFT JOIN rules r ON r.project_id = e.project_id AND r.id = e.rule_id
LEFT JOIN conversations v ON v.project_id = e.project_id AND v.id = e.conversation_id
LEFT JOIN followup_triggers t ON t.project_id = e.project_id AND t.id = e.trigger_id
WHERE e.project_id = %(project_id)s AND e.id = %(id)s AND e.status = 'pending' AND e.locked_until = %(until)s
FOR UPDATE OF e

-- name: finish
-- An execution executed, or skipped with its reason, and its conditions as re-checked when it fell due.
UPDATE rule_pending_executions
SET status = %(status)s, skip_reason = %(skip_reason)s, message_id = %(message_id)s, executed_at = %(now)s,
    trace = %(trace)s, locked_until = NULL, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: failed
-- An execution whose attempt failed unexpectedly: retried after a backoff, or skipped `failed` after its
-- last attempt (the job runner's verdict).
UPDATE rule_pending_executions
SET attempts = attempts + 1, last_error = %(error)s, locked_until = %(retry_at)s, updated_at = %(now)s,
    status = CASE WHEN %(given_up)s::boolean THEN 'skipped' ELSE status END,
    skip_reason = CASE WHEN %(given_up)s::boolean THEN 'failed' END,
    executed_at = CASE WHEN %(given_up)s::boolean THEN %(now)s::timestamptz END
WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'pending'
RETURNING status

-- name: count_pending
-- How many executions wait (the pending gauge).
SELECT count(*) FROM rule_pending_executions WHERE status = 'pending'

-- name: list_executions
-- A page of a project's executions (of one rule or one conversation), newest first.
SELECT e.id, e.rule_id, e.conversation_id, e.contact_id, e.episode_key, e.due_at, e.status, e.skip_reason,
       e.executed_at, e.message_id, e.attempts, e.created_at, e.updated_at
FROM rule_pending_executions e
WHERE e.project_id = %(project_id)s
  AND (%(rule_id)s::uuid IS NULL OR e.rule_id = %(rule_id)s::uuid)
  AND (%(conversation_id)s::uuid IS NULL OR e.conversation_id = %(conversation_id)s::uuid)
  AND (%(status)s::text IS NULL OR e.status = %(status)s::text)
  AND (%(after)s::uuid IS NULL
       OR (e.created_at, e.id) < (SELECT a.created_at, a.id FROM rule_pending_executions a
                                 WHERE a.project_id = %(project_id)s AND a.id = %(after)s::uuid))
ORDER BY e.created_at DESC, e.id DESC
LIMIT %(limit)s

-- name: cancel
-- A pending execution of the rule cancelled by hand: skipped `cancelled`, with the row as it is now. A
-- sweeper that leased it finds it no longer pending (lock_leased) and leaves it; one running it right now
-- holds its row lock, so the cancel waits and then finds it finished (nothing returned: not pending).
UPDATE rule_pending_executions e
SET status = 'skipped', skip_reason = 'cancelled', locked_until = NULL, executed_at = %(now)s,
    updated_at = %(now)s
WHERE e.project_id = %(project_id)s AND e.rule_id = %(rule_id)s AND e.id = %(id)s AND e.status = 'pending'
RETURNING e.id, e.rule_id, e.conversation_id, e.contact_id, e.episode_key, e.due_at, e.status,
          e.skip_reason, e.executed_at, e.message_id, e.attempts, e.created_at, e.updated_at

-- name: execution_exists
-- Whether the rule of the project has this execution (told apart from one that is no longer pending).
SELECT 1 FROM rule_pending_executions WHERE project_id = %(project_id)s AND rule_id = %(rule_id)s AND id = %(id)s

-- name: pending_for_contact
-- A contact's delayed rule executions still to come (pending, or being run), soonest first, with their
-- rule's name.
SELECT e.id, e.rule_id, r.name AS rule_name, e.conversation_id, e.due_at, e.status, e.episode_key
FROM rule_pending_executions e
JOIN rules r ON r.project_id = e.project_id AND r.id = e.rule_id
WHERE e.project_id = %(project_id)s AND e.contact_id = %(contact_id)s
  AND e.status IN ('pending', 'processing', 'executing')
ORDER BY e.due_at, e.id
LIMIT %(limit)s

