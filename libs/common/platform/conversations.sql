-- name: get_conversation
-- One conversation of a project.
SELECT id, contact_id, number_id, status, status_changed_at, waiting_since, priority, assignee, team, labels,
       inbox_thread AS inbox, attributes, snoozed_until, last_incoming_message_id, last_outgoing_message_id,
       created_at, updated_at
FROM conversations
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lock_conversation
-- Lock a conversation (inbox events). NO KEY UPDATE: the releaser's SKIP LOCKED still skips it, and rows
-- that merely reference it (a contact's message) do not wait for it in their foreign-key check.
SELECT id, contact_id, number_id, status, status_changed_at, waiting_since, priority, assignee, team, labels,
       inbox_thread AS inbox, attributes, snoozed_until, last_incoming_message_id, last_outgoing_message_id,
       created_at, updated_at
FROM conversations
WHERE project_id = %(project_id)s AND id = %(id)s
FOR NO KEY UPDATE

-- name: insert_conversation
-- Create a conversation for a contact of the project (nothing when the contact or number is not there, or
-- the id is taken).
INSERT INTO conversations (id, project_id, contact_id, number_id, status, status_changed_at, created_at,
                           updated_at)
SELECT %(id)s, c.project_id, c.id, %(number_id)s, %(status)s, %(now)s, %(now)s, %(now)s
FROM contacts c
WHERE c.project_id = %(project_id)s AND c.id = %(contact_id)s AND c.erased_at IS NULL
  AND (%(number_id)s::uuid IS NULL
       OR EXISTS (SELECT 1 FROM numbers n WHERE n.project_id = c.project_id AND n.id = %(number_id)s::uuid))
ON CONFLICT (project_id, id) DO NOTHING
RETURNING id, contact_id, number_id, status, status_changed_at, waiting_since, priority, assignee, team,
          labels, inbox_thread AS inbox, attributes, snoozed_until, last_incoming_message_id,
          last_outgoing_message_id, created_at, updated_at

-- name: set_conversation_status
-- A new status; status_changed_at moves only when the status really changes; resolving ends the wait; a
-- status other than snoozed ends a snooze.
UPDATE conversations
SET status = %(status)s,
    snoozed_until = CASE WHEN %(status)s = 'snoozed' THEN %(snoozed_until)s::timestamptz END,
    status_changed_at = CASE WHEN status = %(status)s THEN status_changed_at ELSE %(now)s END,
    waiting_since = CASE WHEN %(status)s = 'resolved' THEN NULL ELSE waiting_since END,
    updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id, contact_id, number_id, status, status_changed_at, waiting_since, priority, assignee, team,
          labels, inbox_thread AS inbox, attributes, snoozed_until, last_incoming_message_id,
          last_outgoing_message_id, created_at, updated_at

-- name: contact_and_number_exist
-- Why a conversation was not created: whether its contact (not erased) and its number are the project's.
SELECT EXISTS (SELECT 1 FROM contacts c
               WHERE c.project_id = %(project_id)s AND c.id = %(contact_id)s AND c.erased_at IS NULL),
       %(number_id)s::uuid IS NULL
       OR EXISTS (SELECT 1 FROM numbers n WHERE n.project_id = %(project_id)s AND n.id = %(number_id)s::uuid)

-- name: open_conversation
-- The contact's newest conversation that is not resolved.
SELECT id FROM conversations
WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s AND status <> 'resolved'
ORDER BY created_at DESC
LIMIT 1

-- name: update_conversation
-- The inbox fields of a locked conversation, as the caller computed them.
UPDATE conversations
SET priority = %(priority)s, assignee = %(assignee)s, team = %(team)s, labels = %(labels)s,
    attributes = %(attributes)s, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id, contact_id, number_id, status, status_changed_at, waiting_since, priority, assignee, team,
          labels, inbox_thread AS inbox, attributes, snoozed_until, last_incoming_message_id,
          last_outgoing_message_id, created_at, updated_at

-- name: insert_private_note
-- A private note on a conversation: an entry of the contact's timeline that the contact never sees.
INSERT INTO activities (project_id, contact_id, kind, data, occurred_at)
VALUES (%(project_id)s, %(contact_id)s, 'private_note', %(data)s, %(now)s)
