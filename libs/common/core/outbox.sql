-- name: insert_events
-- Record domain events of one project in the caller's transaction, in the order given (the one writer of
-- the outbox): a JSON array of {type, aggregate_type, aggregate_id, data}.
INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
SELECT %(project_id)s, e.value->>'type', e.value->>'aggregate_type', (e.value->>'aggregate_id')::uuid,
       e.value->'data', %(occurred_at)s
FROM jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e(value, n)
ORDER BY e.n

-- name: try_relay_lock
-- Only one relay publishes at a time, so events leave in id order: a session lock, held from the read
-- through the publish (outside any transaction) to the mark.
SELECT pg_try_advisory_lock(%(key)s)

-- name: relay_unlock
-- Release the relay lock after the batch.
SELECT pg_advisory_unlock(%(key)s)

-- name: unpublished_events
-- The oldest unpublished events, in id order, each with how long it has waited (seconds: the backlog gauge).
SELECT id, event_id, type, project_id, aggregate_type, aggregate_id, data, occurred_at,
       extract(epoch FROM now() - occurred_at)::float8
FROM outbox
WHERE published_at IS NULL
ORDER BY id
LIMIT %(limit)s

-- name: mark_published
-- Mark a published batch (found by the unpublished index: the outbox's key leads with the project).
UPDATE outbox SET published_at = now() WHERE id = ANY(%(ids)s) AND published_at IS NULL

-- name: oldest_unpublished_age
-- How long the oldest unpublished event has waited (seconds; nothing when none waits).
SELECT extract(epoch FROM now() - occurred_at) FROM outbox
WHERE published_at IS NULL
ORDER BY id
LIMIT 1

-- name: published_outbox
-- A project's outbox rows published more than 7 days ago, a batch at a time (the retention job): the batch
-- is picked through the project's part of the published index and deleted by primary key.
DELETE FROM outbox
WHERE project_id = %(project_id)s AND id = ANY(ARRAY(
    SELECT id FROM outbox
    WHERE project_id = %(project_id)s AND published_at IS NOT NULL
      AND published_at < %(now)s::timestamptz - interval '7 days'
    ORDER BY published_at
    LIMIT %(limit)s
))

-- name: erase_contact
-- Privacy erasure, the outbox's part: the contact's message.claimed events (they carry the phone and the
-- text for the send lane) leave the outbox.
DELETE FROM outbox
WHERE project_id = %(project_id)s AND type = 'message.claimed' AND data->>'contact_id' = %(contact_id)s::text
