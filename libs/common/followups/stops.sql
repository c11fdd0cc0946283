-- name: lock_stoppable
-- The contact's live enrollments whose copied stop flag matches, locked (one indexed scan on contact_id).
-- With a conversation (inbox events), only those tied to it or to no conversation. A reply also takes
-- those waiting for it at a wait_for_reply step with a reply path (reply_step set), to move them there.
SELECT id, sequence_id, contact_id, version_id, anchor_at, step_index, reply_step
FROM followup_enrollments
WHERE contact_id = %(contact_id)s
  AND status IN ('active', 'paused')
  AND project_id = %(project_id)s
  AND (%(conversation_id)s::uuid IS NULL OR conversation_id IS NULL
       OR conversation_id = %(conversation_id)s::uuid)
  AND CASE %(flag)s::text
          WHEN 'reply' THEN stop_on_reply OR reply_step IS NOT NULL
          WHEN 'human_message' THEN stop_on_human_message
          WHEN 'opt_out' THEN stop_on_opt_out
          WHEN 'lead_closed' THEN stop_on_lead_closed
          WHEN 'conversation_resolved' THEN stop_on_conversation_resolved
          ELSE true
      END
ORDER BY id
FOR UPDATE

-- name: queued_followups
-- The contact's follow-up messages still QUEUED whose enrollment carries the stop flag (or is the one
-- given). This also covers the last message of an enrollment that completed before the event arrived. An
-- opt-out takes every queued follow-up, whatever the flag: nothing is ever sent to an opted-out contact.
SELECT m.id
FROM messages m
JOIN followup_enrollments e ON e.project_id = m.project_id AND e.id = m.followup_enrollment_id
WHERE m.contact_id = %(contact_id)s
  AND m.status = 'QUEUED'
  AND m.source = 'followup'
  AND m.project_id = %(project_id)s
  AND (%(conversation_id)s::uuid IS NULL OR e.conversation_id IS NULL
       OR e.conversation_id = %(conversation_id)s::uuid)
  AND (%(enrollment_id)s::uuid IS NULL OR e.id = %(enrollment_id)s::uuid)
  AND CASE %(flag)s::text
          WHEN 'reply' THEN e.stop_on_reply
          WHEN 'human_message' THEN e.stop_on_human_message
          WHEN 'opt_out' THEN true
          WHEN 'lead_closed' THEN e.stop_on_lead_closed
          WHEN 'conversation_resolved' THEN e.stop_on_conversation_resolved
          ELSE true
      END
ORDER BY m.id

-- name: reply_step_run
-- The wait's step run when a reply takes its reply path: branched, replied (its key keeps it once).
INSERT INTO followup_step_runs (enrollment_id, step_index, project_id, outcome, reason, due_at, ran_at)
SELECT id, %(step_index)s, project_id, 'branched', 'replied', coalesce(step_due_at, next_run_at), %(now)s
FROM followup_enrollments
WHERE project_id = %(project_id)s AND id = %(enrollment_id)s
ON CONFLICT DO NOTHING
