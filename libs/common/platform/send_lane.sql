-- name: queued_shares
-- The projects with QUEUED messages in turns (jobs.RoundRobin): those after %(after)s in id order, wrapping
-- around, at most %(projects)s of them, and the share of a claim of %(limit)s each may take, counted from
-- the queued project index (project_shares). Read without locks: each project's claim locks its own (an
-- all-projects claim).
SELECT project_id, share
FROM project_shares('messages', $$q.status = 'QUEUED'$$,
                    $$q.direction = 'outbound' AND ($2 IS NULL OR q.number_id = $2)$$,
                    %(after)s, %(projects)s, %(limit)s, %(now)s, %(number_id)s)

-- name: pick_queued_messages
-- The first half of a claim (:data:`CLAIM_QUEUED_MESSAGES`): the project's QUEUED outbound messages in
-- priority then age order, up to %(share)s, locked (SKIP LOCKED: claimers never wait for each other). One
-- project: a claim routed to one shard.
WITH picked AS (
    SELECT id FROM messages
    WHERE project_id = %(project_id)s AND status = 'QUEUED' AND direction = 'outbound'
      AND (%(number_id)s::uuid IS NULL OR number_id = %(number_id)s::uuid)
    ORDER BY priority, created_at
    LIMIT %(share)s
    FOR UPDATE SKIP LOCKED
)

-- name: claim_picked
-- The second half of every claim, after its `picked` CTE: each picked message becomes PROCESSING with a
-- status event; returns what the send lane needs to send them, in priority then age order.
, claimed AS (
    UPDATE messages m SET status = 'PROCESSING', status_changed_at = %(now)s
    FROM picked WHERE m.project_id = %(project_id)s AND m.id = picked.id
    RETURNING m.id, m.project_id, m.contact_id, m.conversation_id, m.number_id, m.priority, m.body, m.media_url,
              m.media_kind, m.source, m.followup_enrollment_id, m.template_name, m.template_language,
              m.template_parameters, m.created_at
), status_events AS (
    INSERT INTO message_status_events (project_id, message_id, status, occurred_at)
    SELECT project_id, id, 'PROCESSING', %(now)s FROM claimed
)
SELECT claimed.id, claimed.project_id, claimed.contact_id, c.phone, claimed.conversation_id, claimed.number_id,
       claimed.priority, claimed.body, claimed.media_url, claimed.media_kind, claimed.source,
       claimed.followup_enrollment_id, claimed.template_name, claimed.template_language, claimed.template_parameters, claimed.created_at
FROM claimed JOIN contacts c ON c.project_id = %(project_id)s AND c.id = claimed.contact_id
ORDER BY claimed.priority, claimed.created_at

-- name: lock_message
-- Lock an outbound message of the project by our id or the provider's.
SELECT id, status, provider_message_id, error, error_code, status_changed_at, followup_enrollment_id, contact_id,
       conversation_id, number_id
FROM messages
WHERE project_id = %(project_id)s AND direction = 'outbound'
  AND (id = %(id)s::uuid OR (%(id)s::uuid IS NULL AND provider_message_id = %(provider_message_id)s::text))
FOR UPDATE

-- name: set_message_status
-- Move a message forward, with its status event.
WITH updated AS (
    UPDATE messages
    SET status = %(status)s, status_changed_at = %(now)s,
        provider_message_id = coalesce(%(provider_message_id)s, provider_message_id),
        error = coalesce(%(error)s, error), error_code = coalesce(%(error_code)s, error_code)
    WHERE project_id = %(project_id)s AND id = %(id)s
    RETURNING id, project_id, status, provider_message_id, error, error_code, status_changed_at, followup_enrollment_id,
              contact_id, conversation_id, number_id
), status_events AS (
    INSERT INTO message_status_events (project_id, message_id, status, detail, occurred_at)
    SELECT project_id, id, status, error, %(now)s FROM updated
)
SELECT id, status, provider_message_id, error, error_code, status_changed_at, followup_enrollment_id, contact_id,
       conversation_id, number_id
FROM updated

-- name: pick_queued_for_numbers
-- The first half of a claim (:data:`CLAIM_QUEUED_FOR_NUMBERS`): one project's QUEUED outbound messages
-- number by number, up to each number's quota (one probe of the queued-number index per number: no number's
-- backlog delays another's), priority then age order within a number, locked (SKIP LOCKED). One project: a
-- claim routed to one shard.
WITH picked AS (
    SELECT m.id
    FROM unnest(%(number_ids)s::uuid[], %(quotas)s::int[]) AS q(number_id, quota)
    CROSS JOIN LATERAL (
        SELECT id FROM messages
        WHERE project_id = %(project_id)s AND number_id = q.number_id
          AND status = 'QUEUED' AND direction = 'outbound'
        ORDER BY priority, created_at
        LIMIT q.quota
        FOR UPDATE SKIP LOCKED
    ) m
)

-- name: claimed_messages
-- Claimed (PROCESSING) outbound messages of a project, as the claim returns them (a send retried).
SELECT m.id, m.project_id, m.contact_id, c.phone, m.conversation_id, m.number_id, m.priority, m.body,
       m.media_url, m.media_kind, m.source, m.followup_enrollment_id, m.template_name, m.template_language,
       m.template_parameters, m.created_at
FROM messages m JOIN contacts c ON c.project_id = m.project_id AND c.id = m.contact_id
WHERE m.project_id = %(project_id)s AND m.id = ANY(%(ids)s::uuid[])
  AND m.status = 'PROCESSING' AND m.direction = 'outbound'

-- name: queued_per_number
-- How many QUEUED outbound messages each of these numbers has (counted up to a cap: the claim's demand).
SELECT q.project_id, q.number_id,
       (SELECT count(*) FROM (
            SELECT 1 FROM messages
            WHERE project_id = q.project_id AND number_id = q.number_id
              AND status = 'QUEUED' AND direction = 'outbound'
            LIMIT %(cap)s) AS queued) AS queued
FROM unnest(%(project_ids)s::uuid[], %(number_ids)s::uuid[]) AS q(project_id, number_id)

-- name: set_messages_sent
-- Many claimed messages of a project SENT at once, each with its provider id and status event; a message
-- that moved on meanwhile (a status webhook came first) is left as it is.
WITH given AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(provider_ids)s::text[]) AS g(id, provider_message_id)
), updated AS (
    UPDATE messages m
    SET status = 'SENT', status_changed_at = %(now)s,
        provider_message_id = coalesce(g.provider_message_id, m.provider_message_id)
    FROM given g
    WHERE m.project_id = %(project_id)s AND m.id = g.id AND m.direction = 'outbound'
      AND m.status IN ('QUEUED', 'PROCESSING')
    RETURNING m.id, m.project_id, m.status, m.provider_message_id, m.error, m.followup_enrollment_id
), status_events AS (
    INSERT INTO message_status_events (project_id, message_id, status, occurred_at)
    SELECT %(project_id)s, id, status, %(now)s FROM updated
)
SELECT id, provider_message_id, followup_enrollment_id FROM updated

-- name: rate_limited_message
-- The SENT message a rate-limit failure (130429) is about, by our id or the provider's; when the report
-- names the provider's id too, only the attempt it names (a late report of an earlier attempt of a message
-- sent again is not about the message as it is).
SELECT id, status, provider_message_id, error, error_code, status_changed_at, followup_enrollment_id, contact_id,
       conversation_id, number_id, created_at
FROM messages
WHERE project_id = %(project_id)s AND direction = 'outbound' AND status = 'SENT'
  AND (id = %(id)s::uuid OR (%(id)s::uuid IS NULL AND provider_message_id = %(provider_message_id)s::text))
  AND (%(provider_message_id)s::text IS NULL OR provider_message_id = %(provider_message_id)s::text)

-- name: requeue_message
-- A SENT message the provider then failed for its number's rate limit: QUEUED again for the send lane to
-- claim anew (one no longer SENT is left as it is; one already queued again %(most)s times for it too: a
-- report repeated by our id alone cannot send it again and again), with its status event naming the error
-- and what was done.
WITH updated AS (
    UPDATE messages SET status = 'QUEUED', status_changed_at = %(now)s
    WHERE project_id = %(project_id)s AND id = %(id)s AND direction = 'outbound' AND status = 'SENT'
      AND (SELECT count(*) FROM message_status_events e
           WHERE e.message_id = messages.id AND e.project_id = messages.project_id
             AND e.action = %(action)s) < %(most)s
    RETURNING project_id, id, status, provider_message_id, error, error_code, status_changed_at,
              followup_enrollment_id, contact_id, conversation_id, number_id
), status_events AS (
    INSERT INTO message_status_events (project_id, message_id, status, detail, action, occurred_at)
    SELECT project_id, id, 'QUEUED', %(detail)s, %(action)s, %(now)s FROM updated
)
SELECT id, status, provider_message_id, error, error_code, status_changed_at, followup_enrollment_id, contact_id,
       conversation_id, number_id
FROM updated

-- name: record_action
-- What the engine did about a message's failure, in its timeline: a status event of its status as it is.
INSERT INTO message_status_events (project_id, message_id, status, detail, action, occurred_at)
SELECT project_id, id, status, %(detail)s, %(action)s, %(now)s FROM messages
WHERE project_id = %(project_id)s AND id = %(id)s
