-- name: channels_in_turn
-- The numbers with a channel, the least recently served first (read across projects without locks; each is
-- then locked by lock_channel).
SELECT c.project_id, c.number_id
FROM channel_numbers c
ORDER BY c.served_at NULLS FIRST, c.number_id
LIMIT %(limit)s

-- name: lock_channel
-- A number with a channel, locked for this claim (SKIP LOCKED: another replica claiming for it skips it, so
-- the bound per number holds across replicas; nothing when it does), with its sends in flight and its
-- retries due. One project: routed to one shard.
SELECT c.project_id, c.number_id, c.provider, c.account_id, c.sender, c.credentials, c.created_at,
       c.updated_at,
       (SELECT count(*) FROM channel_sends s
        WHERE s.project_id = c.project_id AND s.number_id = c.number_id AND s.state = 'sending') AS in_flight,
       (SELECT count(*) FROM channel_sends s
        WHERE s.project_id = c.project_id AND s.number_id = c.number_id AND s.state = 'retry'
          AND s.next_attempt_at <= %(now)s) AS retries_due
FROM channel_numbers c
WHERE c.project_id = %(project_id)s AND c.number_id = %(number_id)s
FOR UPDATE OF c SKIP LOCKED

-- name: expire_leases
-- Sends of these numbers whose lease ran out (the worker died during the call): their answer is lost,
-- so they wait for a status like any unconfirmed send; never sent again.
UPDATE channel_sends s
SET state = 'unconfirmed', next_attempt_at = s.expires_at, last_error = 'lease_expired'
FROM unnest(%(project_ids)s::uuid[], %(number_ids)s::uuid[]) AS n(project_id, number_id)
WHERE s.project_id = n.project_id AND s.number_id = n.number_id
  AND s.state = 'sending' AND s.next_attempt_at <= %(now)s
RETURNING s.project_id, s.message_id

-- name: expired_sends
-- Retries and unconfirmed sends of these numbers past the message's lifetime: they end FAILED.
DELETE FROM channel_sends s
USING unnest(%(project_ids)s::uuid[], %(number_ids)s::uuid[]) AS n(project_id, number_id)
WHERE s.project_id = n.project_id AND s.number_id = n.number_id
  AND s.state IN ('retry', 'unconfirmed') AND s.expires_at <= %(now)s
RETURNING s.project_id, s.message_id, s.state, s.last_error

-- name: claim_retries
-- Take up to each of the project's numbers' quota of its due retries (the oldest due first): leased, attempt
-- counted. One project: routed to one shard.
WITH picked AS (
    SELECT s.project_id, s.message_id
    FROM unnest(%(number_ids)s::uuid[], %(quotas)s::int[]) AS q(number_id, quota)
    CROSS JOIN LATERAL (
        SELECT project_id, message_id FROM channel_sends
        WHERE project_id = %(project_id)s AND number_id = q.number_id
          AND state = 'retry' AND next_attempt_at <= %(now)s
        ORDER BY next_attempt_at
        LIMIT q.quota
        FOR UPDATE SKIP LOCKED
    ) s
)
UPDATE channel_sends s
SET state = 'sending', attempts = s.attempts + 1, next_attempt_at = %(lease_until)s
FROM picked WHERE s.project_id = %(project_id)s AND s.message_id = picked.message_id
RETURNING s.project_id, s.message_id, s.attempts

-- name: start_sends
-- The claimed messages' sends: leased (a crash leaves them unconfirmed, never resent), their first attempt.
INSERT INTO channel_sends (project_id, message_id, number_id, state, attempts, next_attempt_at, expires_at)
SELECT project_id, message_id, number_id, 'sending', 1, %(lease_until)s, expires_at
FROM unnest(%(project_ids)s::uuid[], %(message_ids)s::uuid[], %(number_ids)s::uuid[],
            %(expires)s::timestamptz[]) AS n(project_id, message_id, number_id, expires_at)

-- name: served
-- These numbers were just served: the next claims serve the others first.
UPDATE channel_numbers c SET served_at = %(now)s
FROM unnest(%(project_ids)s::uuid[], %(number_ids)s::uuid[]) AS n(project_id, number_id)
WHERE c.project_id = n.project_id AND c.number_id = n.number_id

-- name: finish_send
-- The send is settled (sent, or refused): its row goes.
DELETE FROM channel_sends WHERE project_id = %(project_id)s AND message_id = %(message_id)s

-- name: retry_send
-- The attempt never reached the provider (or was throttled): due again later, unless its lease ran out and
-- the send was judged meanwhile (fenced on the attempt).
UPDATE channel_sends
SET state = 'retry', next_attempt_at = %(next_attempt_at)s, last_error = %(error)s
WHERE project_id = %(project_id)s AND message_id = %(message_id)s AND state = 'sending'
  AND attempts = %(attempt)s
RETURNING message_id

-- name: unconfirm_send
-- The attempt's answer was lost: the send waits for a status (or for the message's lifetime to end).
UPDATE channel_sends
SET state = 'unconfirmed', next_attempt_at = expires_at, last_error = %(error)s
WHERE project_id = %(project_id)s AND message_id = %(message_id)s AND state = 'sending'
  AND attempts = %(attempt)s
RETURNING message_id

-- name: reconciled
-- A status arrived for these messages: their sends waiting for one are settled.
DELETE FROM channel_sends
WHERE project_id = %(project_id)s AND message_id = ANY(%(message_ids)s::uuid[]) AND state = 'unconfirmed'

-- name: finish_sends
-- These sends are settled (sent): their rows go.
DELETE FROM channel_sends WHERE project_id = %(project_id)s AND message_id = ANY(%(message_ids)s::uuid[])
