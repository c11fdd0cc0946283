-- name: lock_contact
-- Lock a contact of the project for a stop path (erased contacts are gone for good).
SELECT id FROM contacts
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL
FOR UPDATE

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
WHERE id = %(id)s AND opted_out_at IS NULL
RETURNING id

-- name: opt_in
-- Record an opt-in (nothing when not opted out and consent already granted).
UPDATE contacts SET opted_out_at = NULL, consent = 'granted', updated_at = %(now)s
WHERE id = %(id)s AND (opted_out_at IS NOT NULL OR consent <> 'granted')
RETURNING id

-- name: erase_contact
-- Privacy erasure: the contact's messages and activities are deleted, the contact is anonymised, and its
-- follow-ups keep no variables or keys that could identify the person.
WITH deleted_messages AS (
    DELETE FROM messages WHERE project_id = %(project_id)s AND contact_id = %(id)s
), deleted_activities AS (
    DELETE FROM activities WHERE project_id = %(project_id)s AND contact_id = %(id)s
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
-- The contact of a lead of the project.
SELECT contact_id FROM leads WHERE project_id = %(project_id)s AND id = %(id)s

-- name: set_lead_status
-- A lead's new status; closing it records when.
UPDATE leads
SET status = %(status)s, closed_at = CASE WHEN %(closed)s THEN %(now)s ELSE closed_at END, updated_at = %(now)s
WHERE id = %(id)s

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
