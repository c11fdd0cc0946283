-- name: lock_open_conversation
-- The conversation to thread into, locked: the one asked for if it is open, else the contact's newest open
-- one. The choice is made first and only that row is locked (SKIP LOCKED), so a busy conversation returns
-- nothing (the caller reports busy) instead of the next open conversation in line.
SELECT id, number_id FROM conversations
WHERE project_id = %(project_id)s AND id = (
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

-- name: insert_queued_message
-- The message (QUEUED), its status event, the project's usage (its monthly count, on one of 8 shards), the
-- conversation's last outgoing message, and the sender's activity in the contact's timeline when it names
-- one (a queued follow-up's followup_sent): one statement.
WITH message AS (
    INSERT INTO messages (
        id, project_id, contact_id, conversation_id, number_id, direction, status, source, priority, body,
        media_url, media_kind, followup_enrollment_id, followup_step_index, sequence_id, sequence_version,
        campaign_id, rule_id, rule_execution_id, template_name, template_language, template_parameters,
        created_at, status_changed_at
    ) VALUES (
        %(message_id)s, %(project_id)s, %(contact_id)s, %(conversation_id)s, %(number_id)s, 'outbound', 'QUEUED',
        %(source)s, %(priority)s, %(body)s, %(media_url)s, %(media_kind)s, %(followup_enrollment_id)s,
        %(followup_step_index)s, %(sequence_id)s, %(sequence_version)s, %(campaign_id)s, %(rule_id)s,
        %(rule_execution_id)s, %(template_name)s, %(template_language)s, %(template_parameters)s, %(now)s,
        %(now)s
    )
    RETURNING id, project_id
), status_event AS (
    INSERT INTO message_status_events (project_id, message_id, status, occurred_at)
    SELECT project_id, id, 'QUEUED', %(now)s FROM message
), usage_count AS (
    INSERT INTO usage_counters (project_id, month, shard, messages)
    SELECT project_id, %(month)s, %(shard)s, 1 FROM message
    WHERE current_setting('followups.preview', true) IS DISTINCT FROM 'on' -- a preview holds no counter row
    ON CONFLICT (project_id, month, shard) DO UPDATE SET messages = usage_counters.messages + 1
), activity AS (
    INSERT INTO activities (project_id, contact_id, kind, data, occurred_at)
    SELECT project_id, %(contact_id)s, %(activity_kind)s, %(activity)s::jsonb, %(now)s FROM message
    WHERE %(activity_kind)s::text IS NOT NULL
)
UPDATE conversations
SET last_outgoing_message_id = %(message_id)s, last_outgoing_at = %(now)s, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(conversation_id)s

-- name: message_by_provider_id
-- A message already recorded under this provider id.
SELECT id, conversation_id FROM messages
WHERE project_id = %(project_id)s AND provider_message_id = %(provider_message_id)s

-- name: insert_inbound_message
-- A contact's message: the message row (RECEIVED), the conversation now waits for an answer, and the
-- contact's last inbound time moves on (what the release step reads for the reply backstop, the "no reply"
-- conditions and the service window; the caller holds the contact's lock).
WITH message AS (
    INSERT INTO messages (project_id, contact_id, conversation_id, direction, status, source, body, media_url,
                          media_kind, provider_message_id, created_at, status_changed_at)
    VALUES (%(project_id)s, %(contact_id)s, %(conversation_id)s, 'inbound', 'RECEIVED', 'contact', %(body)s,
            %(media_url)s, %(media_kind)s, %(provider_message_id)s, %(now)s, %(now)s)
    RETURNING id
), conversation AS (
    UPDATE conversations
    SET last_incoming_message_id = (SELECT id FROM message), last_incoming_at = %(now)s,
        waiting_since = coalesce(waiting_since, %(now)s), updated_at = %(now)s
    WHERE project_id = %(project_id)s AND id = %(conversation_id)s
), contact AS (
    UPDATE contacts SET last_inbound_at = greatest(last_inbound_at, %(now)s)
    WHERE project_id = %(project_id)s AND id = %(contact_id)s
)
SELECT id FROM message

-- name: insert_human_message
-- An agent's message: the message row (SENT, source human), its status event, and the conversation no
-- longer waits.
WITH message AS (
    INSERT INTO messages (project_id, contact_id, conversation_id, number_id, direction, status, source, body,
                          provider_message_id, created_at, status_changed_at)
    VALUES (%(project_id)s, %(contact_id)s, %(conversation_id)s, %(number_id)s, 'outbound', 'SENT', 'human',
            %(body)s, %(provider_message_id)s, %(now)s, %(now)s)
    RETURNING id, project_id
), status_event AS (
    INSERT INTO message_status_events (project_id, message_id, status, occurred_at)
    SELECT project_id, id, 'SENT', %(now)s FROM message
), conversation AS (
    UPDATE conversations
    SET last_outgoing_message_id = (SELECT id FROM message), last_outgoing_at = %(now)s,
        waiting_since = NULL, updated_at = %(now)s
    WHERE project_id = %(project_id)s AND id = %(conversation_id)s
)
SELECT id FROM message

-- name: cancel_queued
-- Cancel outbound messages still QUEUED (a message the send lane has claimed is no longer QUEUED and is
-- left alone), each with a CANCELLED status event.
WITH cancelled AS (
    UPDATE messages
    SET status = 'CANCELLED', error = 'CANCELLED', status_changed_at = %(now)s
    WHERE project_id = %(project_id)s AND id = ANY(%(ids)s) AND status = 'QUEUED'
    RETURNING id, project_id, contact_id, conversation_id, followup_enrollment_id
), status_events AS (
    INSERT INTO message_status_events (project_id, message_id, status, detail, occurred_at)
    SELECT project_id, id, 'CANCELLED', %(detail)s::text, %(now)s FROM cancelled
)
SELECT id, contact_id, conversation_id, followup_enrollment_id FROM cancelled ORDER BY id

-- name: recent_messages
-- A contact's last messages with a text, newest first (in one conversation when one is named; cancelled
-- ones left out): what an AI step's prompt quotes.
SELECT m.direction, m.source, m.body, m.created_at
FROM messages m
WHERE m.project_id = %(project_id)s AND m.contact_id = %(contact_id)s
  AND (%(conversation_id)s::uuid IS NULL OR m.conversation_id = %(conversation_id)s::uuid)
  AND m.body IS NOT NULL AND m.status <> 'CANCELLED'
ORDER BY m.created_at DESC
LIMIT %(limit)s

-- name: list_messages
-- A page of the project's messages, newest first, after the cursor, with the optional filters (or the one
-- message ``id``). Run unprepared: each filter left NULL folds away, and the plan walks the project's index
-- of the filter given.
SELECT m.id, m.contact_id, m.conversation_id, m.number_id, m.direction, m.status, m.source,
       m.followup_enrollment_id, m.followup_step_index, m.sequence_id, m.sequence_version, m.campaign_id,
       m.rule_id, m.rule_execution_id, m.body, m.media_url, m.media_kind, m.template_name, m.template_language,
       m.template_parameters, m.provider_message_id, m.error, m.error_code, m.created_at, m.status_changed_at
FROM messages m
WHERE m.project_id = %(project_id)s
  AND (%(id)s::uuid IS NULL OR m.id = %(id)s::uuid)
  AND (%(contact_id)s::uuid IS NULL OR m.contact_id = %(contact_id)s::uuid)
  AND (%(conversation_id)s::uuid IS NULL OR m.conversation_id = %(conversation_id)s::uuid)
  AND (%(enrollment_id)s::uuid IS NULL OR m.followup_enrollment_id = %(enrollment_id)s::uuid)
  AND (%(rule_id)s::uuid IS NULL OR m.rule_id = %(rule_id)s::uuid)
  AND (%(sequence_id)s::uuid IS NULL OR m.sequence_id = %(sequence_id)s::uuid)
  AND (%(campaign_id)s::uuid IS NULL OR m.campaign_id = %(campaign_id)s::uuid)
  AND (%(source)s::text IS NULL OR m.source = %(source)s::text)
  AND (%(status)s::text IS NULL OR m.status = %(status)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR m.created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR m.created_at < %(created_before)s::timestamptz)
  AND (%(after)s::uuid IS NULL
       OR (m.created_at, m.id) < (SELECT a.created_at, a.id FROM messages a
                                 WHERE a.project_id = %(project_id)s AND a.id = %(after)s::uuid))
ORDER BY m.created_at DESC, m.id DESC
LIMIT %(limit)s

-- name: status_history
-- A message's status events, oldest first (QUEUED, PROCESSING, SENT, ... as the send lane reported them).
SELECT status, detail, action, occurred_at
FROM message_status_events
WHERE project_id = %(project_id)s AND message_id = %(id)s
ORDER BY id

-- name: last_outbound_at
-- When the contact was last sent a message, whatever sent it (a cancelled one never went): one probe of the
-- contact's messages, newest first.
SELECT created_at FROM messages
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND direction = 'outbound'
  AND status <> 'CANCELLED'
ORDER BY created_at DESC
LIMIT 1

-- name: recent_outbound
-- When the engine's latest messages to the contact since %(since)s were queued (every kind but an agent's;
-- a cancelled one never went), newest first, at most %(limit)s: what its frequency caps count.
SELECT created_at FROM messages
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND direction = 'outbound'
  AND source <> 'human' AND status <> 'CANCELLED' AND created_at > %(since)s
ORDER BY created_at DESC
LIMIT %(limit)s
