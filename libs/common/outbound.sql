-- name: lock_open_conversation
-- The conversation to thread into, locked: the one asked for if it is open, else the contact's newest open
-- one. The choice is made first and only that row is locked (SKIP LOCKED), so a busy conversation returns
-- nothing (the caller reports busy) instead of the next open conversation in line.
SELECT id, number_id FROM conversations
WHERE id = (
    SELECT c.id FROM conversations c
    WHERE c.project_id = %(project_id)s AND c.contact_id = %(contact_id)s AND c.status <> 'resolved'
    ORDER BY c.id = %(conversation_id)s::uuid DESC NULLS LAST, c.created_at DESC, c.id
    LIMIT 1
)
  AND status <> 'resolved'
FOR UPDATE SKIP LOCKED

-- name: open_conversation_exists
-- Whether the contact has an open conversation (told apart from a locked one).
SELECT 1 FROM conversations
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND status <> 'resolved'
LIMIT 1

-- name: insert_conversation
-- Open a new conversation for an outbound message.
INSERT INTO conversations (project_id, contact_id, number_id, status, status_changed_at, created_at, updated_at)
VALUES (%(project_id)s, %(contact_id)s, %(number_id)s, 'open', %(now)s, %(now)s, %(now)s)
RETURNING id, number_id

-- name: insert_queued_message
-- The message (QUEUED), its status event, usage row and message.queued event, and the conversation's
-- last outgoing message: one statement.
WITH message AS (
    INSERT INTO messages (
        id, project_id, contact_id, conversation_id, number_id, direction, status, source, priority, body,
        media_url, media_kind, followup_enrollment_id, followup_step_index, created_at, status_changed_at
    ) VALUES (
        %(id)s, %(project_id)s, %(contact_id)s, %(conversation_id)s, %(number_id)s, 'outbound', 'QUEUED',
        %(source)s, %(priority)s, %(body)s, %(media_url)s, %(media_kind)s, %(followup_enrollment_id)s,
        %(followup_step_index)s, %(now)s, %(now)s
    )
    RETURNING id, project_id, contact_id, conversation_id, number_id, source, priority, followup_enrollment_id
), status_event AS (
    INSERT INTO message_status_events (project_id, message_id, status, occurred_at)
    SELECT project_id, id, 'QUEUED', %(now)s FROM message
), usage_row AS (
    INSERT INTO usage (project_id, kind, quantity, message_id, occurred_at)
    SELECT project_id, 'message', 1, id, %(now)s FROM message
), event AS (
    INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
    SELECT project_id, 'message.queued', 'message', id,
           jsonb_build_object('message_id', id, 'conversation_id', conversation_id, 'contact_id', contact_id,
                              'number_id', number_id, 'source', source, 'priority', priority,
                              'followup_enrollment_id', followup_enrollment_id),
           %(now)s
    FROM message
)
UPDATE conversations
SET last_outgoing_message_id = %(id)s, last_outgoing_at = %(now)s, updated_at = %(now)s
WHERE id = %(conversation_id)s
