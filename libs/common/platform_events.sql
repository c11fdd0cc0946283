-- name: project_exists
-- Whether the project exists (events over the broker name their project without an API key).
SELECT 1 FROM projects WHERE id = %(project_id)s

-- name: lock_contact
-- Lock a contact of the project for a stop path (erased contacts are gone for good). NO KEY UPDATE: it
-- still makes the releaser's FOR SHARE SKIP LOCKED skip the contact, but it does not block the foreign-key
-- checks of rows that reference the contact (an agent's message inserted by a transaction that holds the
-- conversation), which would otherwise deadlock with a reply that holds the contact and waits for the
-- conversation.
SELECT id FROM contacts
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL
FOR NO KEY UPDATE

-- name: lock_contact_for_erasure
-- Lock a contact of the project for erasure: FOR UPDATE, as erasing clears its phone (a key column), so
-- nothing may reference it meanwhile.
SELECT id FROM contacts
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL
FOR UPDATE

-- name: share_contact
-- The conversation's contact may be written to (it is not erased): key-share locked, so an erasure waits
-- for this transaction, or this one sees the erasure once it committed.
SELECT id FROM contacts
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL
FOR KEY SHARE

-- name: message_by_provider_id
-- A message already recorded under this provider id.
SELECT id, conversation_id FROM messages
WHERE project_id = %(project_id)s AND provider_message_id = %(provider_message_id)s

-- name: open_conversation
-- The contact's newest conversation that is not resolved.
SELECT id FROM conversations
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND status <> 'resolved'
ORDER BY created_at DESC
LIMIT 1

-- name: insert_inbound_message
-- A contact's message: the message row (RECEIVED), the conversation now waits for an answer, and a
-- message.received event.
WITH message AS (
    INSERT INTO messages (project_id, contact_id, conversation_id, direction, status, source, body, media_url,
                          media_kind, provider_message_id, created_at, status_changed_at)
    VALUES (%(project_id)s, %(contact_id)s, %(conversation_id)s, 'inbound', 'RECEIVED', 'contact', %(body)s,
            %(media_url)s, %(media_kind)s, %(provider_message_id)s, %(now)s, %(now)s)
    RETURNING id, project_id, contact_id, conversation_id
), conversation AS (
    UPDATE conversations
    SET last_incoming_message_id = (SELECT id FROM message), last_incoming_at = %(now)s,
        waiting_since = coalesce(waiting_since, %(now)s), updated_at = %(now)s
    WHERE id = %(conversation_id)s
), event AS (
    INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
    SELECT project_id, 'message.received', 'message', id,
           jsonb_build_object('message_id', id, 'contact_id', contact_id, 'conversation_id', conversation_id),
           %(now)s
    FROM message
)
SELECT id FROM message

-- name: insert_human_message
-- An agent's message: the message row (SENT, source human), the conversation no longer waits, and a
-- message.human event.
WITH message AS (
    INSERT INTO messages (project_id, contact_id, conversation_id, number_id, direction, status, source, body,
                          provider_message_id, created_at, status_changed_at)
    VALUES (%(project_id)s, %(contact_id)s, %(conversation_id)s, %(number_id)s, 'outbound', 'SENT', 'human',
            %(body)s, %(provider_message_id)s, %(now)s, %(now)s)
    RETURNING id, project_id, contact_id, conversation_id
), status_event AS (
    INSERT INTO message_status_events (project_id, message_id, status, occurred_at)
    SELECT project_id, id, 'SENT', %(now)s FROM message
), conversation AS (
    UPDATE conversations
    SET last_outgoing_message_id = (SELECT id FROM message), last_outgoing_at = %(now)s,
        waiting_since = NULL, updated_at = %(now)s
    WHERE id = %(conversation_id)s
), event AS (
    INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
    SELECT project_id, 'message.human', 'message', id,
           jsonb_build_object('message_id', id, 'contact_id', contact_id, 'conversation_id', conversation_id),
           %(now)s
    FROM message
)
SELECT id FROM message

-- name: opt_out
-- Record an opt-out (nothing when already opted out).
UPDATE contacts SET opted_out_at = %(now)s, consent = 'revoked', updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s AND opted_out_at IS NULL
RETURNING id

-- name: opt_in
-- Record an opt-in (nothing when not opted out and consent already granted).
UPDATE contacts SET opted_out_at = NULL, consent = 'granted', updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s AND (opted_out_at IS NOT NULL OR consent <> 'granted')
RETURNING id

-- name: erase_contact
-- Privacy erasure: the contact's messages, activities and recorded triggers are deleted, the contact is
-- anonymised, its conversations keep no provider thread or pointers to the deleted messages, and its
-- follow-ups keep no variables or keys that could identify the person. Its message.claimed events (they
-- carry the phone and the text for the send lane) are deleted from the outbox too.
WITH deleted_messages AS (
    DELETE FROM messages WHERE project_id = %(project_id)s AND contact_id = %(id)s
), deleted_activities AS (
    DELETE FROM activities WHERE project_id = %(project_id)s AND contact_id = %(id)s
), deleted_triggers AS (
    DELETE FROM followup_triggers WHERE project_id = %(project_id)s AND contact_id = %(id)s
), deleted_events AS (
    DELETE FROM outbox
    WHERE project_id = %(project_id)s AND type = 'message.claimed' AND data->>'contact_id' = %(id)s::text
), conversations AS (
    UPDATE conversations
    SET inbox_thread = NULL, last_incoming_message_id = NULL, last_outgoing_message_id = NULL,
        waiting_since = NULL, updated_at = %(now)s
    WHERE project_id = %(project_id)s AND contact_id = %(id)s
), enrollments AS (
    UPDATE followup_enrollments
    SET variables = '{}'::jsonb, dedupe_key = NULL, note = NULL, last_error = NULL, updated_at = %(now)s
    WHERE project_id = %(project_id)s AND contact_id = %(id)s
)
UPDATE contacts
SET phone = NULL, name = NULL, timezone = NULL, attributes = '{}'::jsonb, tags = '{}', opted_out_at = %(now)s,
    consent = 'revoked', erased_at = %(now)s, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: insert_lead
-- A new lead (nothing when a lead with this id exists).
INSERT INTO leads (id, project_id, contact_id, status, created_at, updated_at)
VALUES (%(id)s, %(project_id)s, %(contact_id)s, %(status)s, %(now)s, %(now)s)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: lead_contact
-- The contact of a lead of the project (also: who holds a lead id that was given again).
SELECT contact_id FROM leads WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lock_lead
-- A lead's current status, locked (taken after its contact's lock, so lead events apply one at a time).
SELECT status, closed_at IS NOT NULL AS closed FROM leads
WHERE project_id = %(project_id)s AND id = %(id)s
FOR NO KEY UPDATE

-- name: set_lead_status
-- A lead's new status: closing it records when (once: a repeated close keeps the first time); any other
-- status reopens it.
UPDATE leads
SET status = %(status)s,
    closed_at = CASE WHEN %(closed)s THEN coalesce(closed_at, %(now)s) END,
    updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lead_exists
-- Whether a lead belongs to the project (a deal may only point at the project's own leads).
SELECT 1 FROM leads WHERE project_id = %(project_id)s AND id = %(lead_id)s

-- name: set_deal_stage
-- A known deal's new stage; returns its contact.
UPDATE deals SET stage = %(stage)s, lead_id = coalesce(%(lead_id)s, lead_id), updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING contact_id

-- name: insert_deal
-- A new deal at its first stage, for a contact of the project; returns its contact.
INSERT INTO deals (id, project_id, contact_id, lead_id, stage, created_at, updated_at)
SELECT %(id)s, %(project_id)s, c.id, %(lead_id)s, %(stage)s, %(now)s, %(now)s
FROM contacts c
WHERE c.project_id = %(project_id)s AND c.id = %(contact_id)s AND c.erased_at IS NULL
ON CONFLICT (id) DO NOTHING
RETURNING contact_id
