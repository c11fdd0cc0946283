-- name: stop_live_enrollments
-- ONE indexed UPDATE over the contact's live enrollments whose copied stop flag matches; each stopped
-- enrollment gets a followup.stopped event. Returns the stopped enrollments.
WITH stopped AS (
    UPDATE followup_enrollments
    SET status = 'stopped', reason = %(reason)s, finished_at = %(now)s, updated_at = %(now)s
    WHERE contact_id = %(contact_id)s
      AND status IN ('active', 'paused')
      AND project_id = %(project_id)s
      AND (%(conversation_id)s::uuid IS NULL OR conversation_id IS NULL
           OR conversation_id = %(conversation_id)s::uuid)
      AND CASE %(flag)s::text
              WHEN 'reply' THEN stop_on_reply
              WHEN 'human_message' THEN stop_on_human_message
              WHEN 'opt_out' THEN stop_on_opt_out
              WHEN 'lead_closed' THEN stop_on_lead_closed
              WHEN 'conversation_resolved' THEN stop_on_conversation_resolved
              ELSE true
          END
    RETURNING id, project_id, sequence_id, contact_id
), events AS (
    INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
    SELECT project_id, 'followup.stopped', 'followup_enrollment', id,
           jsonb_build_object('enrollment_id', id, 'sequence_id', sequence_id, 'contact_id', contact_id,
                              'reason', %(reason)s::text),
           %(now)s
    FROM stopped
)
SELECT id FROM stopped

-- name: cancel_queued_followups
-- The contact's follow-up messages still QUEUED (not yet claimed by the send lane) whose enrollment
-- carries the stop flag: CANCELLED, with a status event and a message.failed event (reason CANCELLED).
-- This also covers the last message of an enrollment that completed before the event arrived. An opt-out
-- cancels every queued follow-up, whatever the flag: nothing is ever sent to an opted-out contact.
WITH cancelled AS (
    UPDATE messages m
    SET status = 'CANCELLED', error = 'CANCELLED', status_changed_at = %(now)s
    FROM followup_enrollments e
    WHERE m.contact_id = %(contact_id)s
      AND m.status = 'QUEUED'
      AND m.source = 'followup'
      AND m.project_id = %(project_id)s
      AND e.id = m.followup_enrollment_id
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
    RETURNING m.id, m.project_id, m.contact_id, m.conversation_id, m.followup_enrollment_id
), status_events AS (
    INSERT INTO message_status_events (project_id, message_id, status, detail, occurred_at)
    SELECT project_id, id, 'CANCELLED', %(reason)s::text, %(now)s FROM cancelled
), events AS (
    INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
    SELECT project_id, 'message.failed', 'message', id,
           jsonb_build_object('message_id', id, 'reason', 'CANCELLED', 'contact_id', contact_id,
                              'conversation_id', conversation_id, 'followup_enrollment_id', followup_enrollment_id,
                              'stop_reason', %(reason)s::text),
           %(now)s
    FROM cancelled
)
SELECT id FROM cancelled
