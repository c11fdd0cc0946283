-- name: claim_queued_messages
-- Claim QUEUED outbound messages in priority then age order (SKIP LOCKED: claimers never wait for each
-- other); each becomes PROCESSING with a status event and a message.claimed event that carries what the
-- send lane needs to send it (a send lane that claims over RabbitMQ learns of its messages from it).
WITH picked AS (
    SELECT id FROM messages
    WHERE status = 'QUEUED' AND direction = 'outbound'
      AND (%(project_id)s::uuid IS NULL OR project_id = %(project_id)s::uuid)
      AND (%(number_id)s::uuid IS NULL OR number_id = %(number_id)s::uuid)
    ORDER BY priority, created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE messages m SET status = 'PROCESSING', status_changed_at = %(now)s
    FROM picked WHERE m.id = picked.id
    RETURNING m.id, m.project_id, m.contact_id, m.conversation_id, m.number_id, m.priority, m.body, m.media_url,
              m.media_kind, m.source, m.followup_enrollment_id, m.created_at
), status_events AS (
    INSERT INTO message_status_events (project_id, message_id, status, occurred_at)
    SELECT project_id, id, 'PROCESSING', %(now)s FROM claimed
), events AS (
    INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
    SELECT claimed.project_id, 'message.claimed', 'message', claimed.id,
           jsonb_build_object('message_id', claimed.id, 'contact_id', claimed.contact_id, 'phone', c.phone,
                              'conversation_id', claimed.conversation_id, 'number_id', claimed.number_id,
                              'priority', claimed.priority, 'body', claimed.body, 'media_url', claimed.media_url,
                              'media_kind', claimed.media_kind, 'source', claimed.source,
                              'followup_enrollment_id', claimed.followup_enrollment_id),
           %(now)s
    FROM claimed JOIN contacts c ON c.id = claimed.contact_id
)
SELECT claimed.id, claimed.project_id, claimed.contact_id, c.phone, claimed.conversation_id, claimed.number_id,
       claimed.priority, claimed.body, claimed.media_url, claimed.media_kind, claimed.source,
       claimed.followup_enrollment_id, claimed.created_at
FROM claimed JOIN contacts c ON c.id = claimed.contact_id
ORDER BY claimed.priority, claimed.created_at

-- name: lock_message
-- Lock an outbound message of the project by our id or the provider's.
SELECT id, status, provider_message_id, error, status_changed_at
FROM messages
WHERE project_id = %(project_id)s AND direction = 'outbound'
  AND (id = %(id)s::uuid OR (%(id)s::uuid IS NULL AND provider_message_id = %(provider_message_id)s::text))
FOR UPDATE

-- name: set_status
-- Move a message forward, with its status event and outbox event.
WITH updated AS (
    UPDATE messages
    SET status = %(status)s, status_changed_at = %(now)s,
        provider_message_id = coalesce(%(provider_message_id)s, provider_message_id),
        error = coalesce(%(error)s, error)
    WHERE id = %(id)s
    RETURNING id, project_id, status, provider_message_id, error, status_changed_at, followup_enrollment_id
), status_events AS (
    INSERT INTO message_status_events (project_id, message_id, status, detail, occurred_at)
    SELECT project_id, id, status, error, %(now)s FROM updated
), events AS (
    INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
    SELECT project_id, %(event_type)s, 'message', id,
           jsonb_build_object('message_id', id, 'status', status, 'provider_message_id', provider_message_id,
                              'error', error, 'followup_enrollment_id', followup_enrollment_id),
           %(now)s
    FROM updated
)
SELECT id, status, provider_message_id, error, status_changed_at FROM updated
