-- The one home of every change to an enrollment after it was created: advance, defer, pause, resume,
-- finish (completed, stopped or failed, with a reason; converted or exited by a criterion met), a late
-- conversion, a counted failure, a new schedule, and erasure; and a released step's run, written in the
-- statement of the move that follows it.
-- The enrollments a transition applies to were locked by the caller (claimed, or selected FOR UPDATE).

-- name: advance
-- Move to the next step (due at next_run_at) and remember the last follow-up message, if one was queued,
-- and the conversation it went to when the enrollment had none.
UPDATE followup_enrollments
SET step_index = %(step_index)s, next_run_at = %(next_run_at)s, step_due_at = %(next_run_at)s,
    waiting_reason = NULL, waiting_values = NULL, unavailable_since = NULL, reply_step = %(reply_step)s,
    last_message_id = coalesce(%(message_id)s, last_message_id),
    conversation_id = coalesce(conversation_id, %(conversation_id)s::uuid),
    last_step_at = %(now)s, failure_count = 0, locked_until = NULL, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: insert_step_run
-- A step's run (a step held back: with the values its check compared), written as a part of the statement
-- that moves the enrollment on (advance_step, finish_step in transitions.py): its primary key (project,
-- enrollment, step) makes a second send of a step impossible. (A queued step's followup_sent activity is
-- written by the platform with its message, in the message's statement.)
INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, reason, reason_values,
                                message_id, due_at, ran_at)
VALUES (%(enrollment_id)s, %(run_step)s, %(project_id)s, %(outcome)s, %(run_reason)s, %(values)s,
        %(message_id)s, %(due_at)s, %(now)s)

-- name: take_reply_path
-- A reply reached an enrollment waiting at a wait_for_reply step with a reply path: it moves to the reply
-- path's first step (due at next_run_at), and replies before now no longer stop it.
UPDATE followup_enrollments
SET step_index = %(step_index)s, next_run_at = %(next_run_at)s, step_due_at = %(next_run_at)s,
    waiting_reason = NULL, waiting_values = NULL, unavailable_since = NULL, reply_step = %(reply_step)s,
    reply_taken_at = %(now)s, last_step_at = %(now)s, locked_until = NULL, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: assign
-- Record the variant of an experiment (a split step) the enrollment was assigned.
UPDATE followup_enrollments
SET assignments = coalesce(assignments, '{}'::jsonb) || jsonb_build_object(%(experiment)s::text, %(variant)s::text)
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: defer
-- Try the same step again later, saying why and with what values (an AI step's lease is given back);
-- unavailable_since is kept once set.
UPDATE followup_enrollments
SET next_run_at = %(next_run_at)s, waiting_reason = %(reason)s, waiting_values = %(values)s, locked_until = NULL,
    unavailable_since = coalesce(%(unavailable_since)s, unavailable_since)
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: pause
-- Pause active enrollments, with the reason (manual, sequence_paused).
UPDATE followup_enrollments
SET status = 'paused', reason = %(reason)s, locked_until = NULL, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s) AND status = 'active'
RETURNING *

-- name: resume
-- Resume paused enrollments; a step that fell due meanwhile is due now.
UPDATE followup_enrollments
SET status = 'active', reason = NULL, next_run_at = greatest(next_run_at, %(now)s),
    step_due_at = greatest(coalesce(step_due_at, next_run_at), %(now)s), waiting_reason = NULL, waiting_values = NULL,
    unavailable_since = NULL, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s) AND status = 'paused'
RETURNING *

-- name: finish
-- Finish live enrollments: completed, stopped or failed, with the reason (and a note). The last step's
-- advance folds in here: step_index, last message (and its conversation, when the enrollment had none) and
-- last step time, when given. Nothing is due any more: a next run still ahead is brought back to now. The
-- project's live count loses them (migration 0027: the session's shard).
WITH finished AS (
    UPDATE followup_enrollments
    SET status = %(status)s, reason = %(reason)s, note = coalesce(%(note)s, note), finished_at = %(now)s,
        locked_until = NULL, updated_at = %(now)s, next_run_at = least(next_run_at, %(now)s),
        step_index = coalesce(%(step_index)s, step_index),
        last_message_id = coalesce(%(message_id)s, last_message_id),
        conversation_id = coalesce(conversation_id, %(conversation_id)s::uuid),
        last_step_at = CASE WHEN %(step_index)s::integer IS NULL THEN last_step_at ELSE %(now)s END
    WHERE project_id = %(project_id)s AND id = ANY(%(ids)s) AND status IN ('active', 'paused')
    RETURNING 1
)
INSERT INTO followup_live_counters AS c (project_id, shard, live)
SELECT %(project_id)s, pg_backend_pid() & 15, -count(*) FROM finished
WHERE current_setting('followups.preview', true) IS DISTINCT FROM 'on' -- a preview holds no counter row
HAVING count(*) > 0
ON CONFLICT (project_id, shard) DO UPDATE SET live = c.live + excluded.live

-- name: end_by_criterion
-- End live enrollments whose sequence's goal or exit was met (each id with its criterion's name): converted
-- (the goal, when, and the step it is attributed to: the last of its messages that was sent, read through
-- the enrollment's messages index) or exited (the exit's name). Nothing is due any more. The project's live
-- count loses them, as finish does. Returns each one ended with its step.
WITH met AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(names)s::text[]) AS m (id, name)
), ended AS (
    UPDATE followup_enrollments e
    SET status = %(status)s::text, reason = NULL, finished_at = %(now)s, locked_until = NULL,
        updated_at = %(now)s, next_run_at = least(e.next_run_at, %(now)s),
        goal = CASE WHEN %(status)s::text = 'converted' THEN m.name ELSE e.goal END,
        converted_at = CASE WHEN %(status)s::text = 'converted' THEN %(now)s ELSE e.converted_at END,
        converted_step = CASE WHEN %(status)s::text = 'converted' THEN (
            SELECT s.followup_step_index FROM messages s
            WHERE s.project_id = e.project_id AND s.followup_enrollment_id = e.id
              AND s.status IN ('PROCESSING', 'SENT', 'DELIVERED', 'READ')
            ORDER BY s.created_at DESC, s.id DESC LIMIT 1
        ) ELSE e.converted_step END,
        exited_by = CASE WHEN %(status)s::text = 'exited' THEN m.name ELSE e.exited_by END
    FROM met m
    WHERE e.project_id = %(project_id)s AND e.id = m.id AND e.status IN ('active', 'paused')
    RETURNING e.id, e.converted_step
), counted AS (
    INSERT INTO followup_live_counters AS c (project_id, shard, live)
    SELECT %(project_id)s, pg_backend_pid() & 15, -count(*) FROM ended
    WHERE current_setting('followups.preview', true) IS DISTINCT FROM 'on' -- a preview holds no counter row
    HAVING count(*) > 0
    ON CONFLICT (project_id, shard) DO UPDATE SET live = c.live + excluded.live
)
SELECT id, converted_step FROM ended

-- name: convert_late
-- A late conversion: finished enrollments not converted yet get the goal met (each id with its name), when,
-- and the step it is attributed to (as end_by_criterion); their status is kept, and one converts once.
-- Returns each one converted with its step.
UPDATE followup_enrollments e
SET goal = m.name, converted_at = %(now)s, updated_at = %(now)s,
    converted_step = (
        SELECT s.followup_step_index FROM messages s
        WHERE s.project_id = e.project_id AND s.followup_enrollment_id = e.id
          AND s.status IN ('PROCESSING', 'SENT', 'DELIVERED', 'READ')
        ORDER BY s.created_at DESC, s.id DESC LIMIT 1
    )
FROM unnest(%(ids)s::uuid[], %(names)s::text[]) AS m (id, name)
WHERE e.project_id = %(project_id)s AND e.id = m.id AND e.status NOT IN ('active', 'paused')
  AND e.converted_at IS NULL
RETURNING e.id, e.converted_step

-- name: lease
-- Lease an AI step for its model call: the claim skips the enrollment until ``until``, and the attempts it
-- returns is the fence the second pass must still find (a lease that expired is claimed again, with a new
-- fence, and the late draft of the first call is dropped).
UPDATE followup_enrollments SET locked_until = %(until)s, attempts = attempts + 1
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING attempts

-- name: count_failure
-- Count an unexpected release failure; returns the consecutive failure count.
UPDATE followup_enrollments
SET failure_count = failure_count + 1, last_error = %(error)s
WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'active'
RETURNING failure_count

-- name: update_schedule
-- New anchor, due time or variables for a live enrollment.
UPDATE followup_enrollments
SET anchor_at = %(anchor_at)s, next_run_at = %(next_run_at)s,
    step_due_at = CASE WHEN next_run_at = %(next_run_at)s THEN step_due_at ELSE %(next_run_at)s END,
    variables = %(variables)s, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s AND status IN ('active', 'paused')
RETURNING *

-- name: anonymise
-- Privacy erasure: the contact's enrollments keep no variables, keys or values of their checks that could
-- identify the person (nor do their step runs).
WITH runs AS (
    UPDATE followup_step_runs r SET reason_values = NULL
    FROM followup_enrollments e
    WHERE r.project_id = %(project_id)s AND e.project_id = r.project_id AND e.id = r.enrollment_id
      AND e.contact_id = %(contact_id)s AND r.reason_values IS NOT NULL
)
UPDATE followup_enrollments
SET variables = '{}'::jsonb, dedupe_key = NULL, note = NULL, last_error = NULL, waiting_values = NULL,
    updated_at = %(now)s
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s

-- name: finished_enrollments
-- A project's finished enrollments older than its retention_days (default 90), oldest first, a batch (the
-- retention job): picked through the project's part of the finished index, deleted by primary key; their
-- step runs go with them (the messages stay: they keep the enrollment's id without a foreign key).
DELETE FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = ANY(ARRAY(
    SELECT e.id FROM followup_enrollments e
    WHERE e.project_id = %(project_id)s AND e.status NOT IN ('active', 'paused')
      AND e.finished_at < %(now)s::timestamptz - interval '1 day'
      AND e.finished_at < %(now)s::timestamptz - make_interval(days => coalesce(
          (SELECT s.retention_days FROM followup_settings s WHERE s.project_id = %(project_id)s), 90))
    ORDER BY e.finished_at
    LIMIT %(limit)s
))

-- name: lock_live_counters
-- The project's 16 live-count shards, each created at 0 when missing, all locked in key order (the
-- recount's first statement): an enrollment or a finish of the project waits until the recount commits.
INSERT INTO followup_live_counters AS c (project_id, shard, live)
SELECT %(project_id)s, shard, 0 FROM generate_series(0, 15) AS shard ORDER BY shard
ON CONFLICT (project_id, shard) DO UPDATE SET live = c.live

-- name: recount_live
-- The project's live enrollments counted anew (the shards locked, in a statement of its own: it sees every
-- change that committed before the lock was held), written as shard 0 (the others to 0); returns the count
-- and what the shards said.
WITH counted AS (
    SELECT count(*) AS live FROM followup_enrollments
    WHERE project_id = %(project_id)s AND status IN ('active', 'paused')
), summed AS (
    SELECT coalesce(sum(live), 0)::bigint AS live FROM followup_live_counters WHERE project_id = %(project_id)s
), written AS (
    UPDATE followup_live_counters c SET live = CASE WHEN c.shard = 0 THEN counted.live ELSE 0 END
    FROM counted
    WHERE c.project_id = %(project_id)s
)
SELECT counted.live, summed.live FROM counted, summed
