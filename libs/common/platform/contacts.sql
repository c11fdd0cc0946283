-- name: insert_contact
-- Create a contact.
INSERT INTO contacts (project_id, phone, name, timezone, attributes, tags)
VALUES (%(project_id)s, %(phone)s, %(name)s, %(timezone)s, %(attributes)s, %(tags)s)
RETURNING id, phone, name, timezone, attributes, tags, opted_out_at, undeliverable_at, consent, created_at, updated_at

-- name: upsert_contact
-- Create the contact with this phone, or merge the given fields into it; returns (id, created).
INSERT INTO contacts (project_id, phone, name, timezone, attributes, tags)
VALUES (%(project_id)s, %(phone)s, %(name)s, %(timezone)s, %(attributes)s, %(tags)s)
ON CONFLICT ON CONSTRAINT contacts_project_phone_key DO UPDATE SET
    name = coalesce(EXCLUDED.name, contacts.name),
    timezone = coalesce(EXCLUDED.timezone, contacts.timezone),
    attributes = contacts.attributes || EXCLUDED.attributes,
    tags = ARRAY(SELECT DISTINCT t FROM unnest(contacts.tags || EXCLUDED.tags) AS t ORDER BY t),
    updated_at = now()
RETURNING id, (xmax = 0) AS created

-- name: get_contact
-- One contact of a project (an erased contact is gone: none).
SELECT id, phone, name, timezone, attributes, tags, opted_out_at, undeliverable_at, consent, created_at, updated_at
FROM contacts
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL

-- name: contact_by_phone
-- The contact with this phone, locked (an upsert that follows compares it with what it becomes).
SELECT id, phone, name, timezone, attributes, tags, opted_out_at, undeliverable_at, consent, created_at, updated_at
FROM contacts
WHERE project_id = %(project_id)s AND phone = %(phone)s
FOR NO KEY UPDATE

-- name: list_contacts
-- A page of contacts in id order (erased contacts left out).
SELECT id, phone, name, timezone, attributes, tags, opted_out_at, undeliverable_at, consent, created_at, updated_at
FROM contacts
WHERE project_id = %(project_id)s AND erased_at IS NULL
  AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(phone)s::text IS NULL OR phone = %(phone)s::text)
ORDER BY id
LIMIT %(limit)s

-- name: update_contact
-- Partial update: name, time zone, attributes merged (null removes a key); none for an erased contact.
UPDATE contacts SET
    name = CASE WHEN %(set_name)s THEN %(name)s::text ELSE name END,
    timezone = CASE WHEN %(set_timezone)s THEN %(timezone)s::text ELSE timezone END,
    attributes = CASE WHEN %(set_attributes)s
                      THEN (attributes - %(removed_attributes)s::text[]) || %(attributes)s::jsonb
                      ELSE attributes END,
    updated_at = now()
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL
RETURNING id, phone, name, timezone, attributes, tags, opted_out_at, undeliverable_at, consent, created_at, updated_at

-- name: add_tags
-- Add tags to a contact (none for an erased contact).
UPDATE contacts SET
    tags = ARRAY(SELECT DISTINCT t FROM unnest(tags || %(tags)s::text[]) AS t ORDER BY t),
    updated_at = now()
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL
RETURNING id, phone, name, timezone, attributes, tags, opted_out_at, undeliverable_at, consent, created_at, updated_at

-- name: remove_tags
-- Remove tags from a contact (none for an erased contact).
UPDATE contacts SET
    tags = ARRAY(SELECT t FROM unnest(tags) AS t WHERE t <> ALL (%(tags)s::text[]) ORDER BY t),
    updated_at = now()
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL
RETURNING id, phone, name, timezone, attributes, tags, opted_out_at, undeliverable_at, consent, created_at, updated_at

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

-- name: share_reachable
-- The contact may still be sent to (not opted out, erased or flagged undeliverable) and has not written
-- since %(since)s: share-locked, so a stop path holding it (a reply, an opt-out: FOR NO KEY UPDATE) is
-- waited for and its change seen (the condition is checked again on the row as it committed).
SELECT id FROM contacts
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL AND opted_out_at IS NULL
  AND undeliverable_at IS NULL AND (last_inbound_at IS NULL OR last_inbound_at < %(since)s)
FOR SHARE

-- name: share_contact
-- The conversation's contact may be written to (it is not erased): key-share locked, so an erasure waits
-- for this transaction, or this one sees the erasure once it committed.
SELECT id FROM contacts
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL
FOR KEY SHARE

-- name: opt_out
-- Record an opt-out (nothing when already opted out, or erased).
UPDATE contacts SET opted_out_at = %(now)s, consent = 'revoked', updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s AND opted_out_at IS NULL AND erased_at IS NULL
RETURNING id

-- name: opt_in
-- Record an opt-in (nothing when not opted out and consent already granted; never for an erased contact).
UPDATE contacts SET opted_out_at = NULL, consent = 'granted', updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s AND (opted_out_at IS NOT NULL OR consent <> 'granted')
  AND erased_at IS NULL
RETURNING id

-- name: flag_undeliverable
-- The provider cannot deliver to the contact (131026, ...): flagged once (the first time is kept).
UPDATE contacts SET undeliverable_at = %(now)s, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s AND undeliverable_at IS NULL AND erased_at IS NULL
RETURNING id

-- name: limit_marketing
-- The provider refused a marketing message for the user's own limit (131049): the contact's marketing
-- follow-ups wait until %(until)s (never sooner than an earlier refusal said).
UPDATE contacts SET marketing_limited_until = greatest(marketing_limited_until, %(until)s)
WHERE project_id = %(project_id)s AND id = %(id)s AND erased_at IS NULL

-- name: erase_contact
-- Privacy erasure, the platform's part: the contact's messages and activities are deleted, the contact is
-- anonymised, and its conversations keep no provider thread or pointers to the deleted messages (its
-- message.claimed events are the outbox's part: core.outbox.erase_contact).
WITH deleted_messages AS (
    DELETE FROM messages WHERE project_id = %(project_id)s AND contact_id = %(id)s
), deleted_activities AS (
    DELETE FROM activities WHERE project_id = %(project_id)s AND contact_id = %(id)s
), conversations AS (
    UPDATE conversations
    SET inbox_thread = NULL, last_incoming_message_id = NULL, last_outgoing_message_id = NULL,
        waiting_since = NULL, updated_at = %(now)s
    WHERE project_id = %(project_id)s AND contact_id = %(id)s
)
UPDATE contacts
SET phone = NULL, name = NULL, timezone = NULL, attributes = '{}'::jsonb, tags = '{}', opted_out_at = %(now)s,
    consent = 'revoked', last_inbound_at = NULL, erased_at = %(now)s, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: contact_names
-- Name and phone of some of the project's contacts (an erased one has neither): the rows of a list.
SELECT id, name, phone FROM contacts
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::uuid[])
