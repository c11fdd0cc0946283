-- name: insert_event
-- Record one domain event in the caller's transaction.
INSERT INTO outbox (project_id, type, aggregate_type, aggregate_id, data, occurred_at)
VALUES (%(project_id)s, %(type)s, %(aggregate_type)s, %(aggregate_id)s, %(data)s, %(occurred_at)s)

-- name: try_relay_lock
-- Only one relay publishes at a time, so events leave in commit order.
SELECT pg_try_advisory_xact_lock(%(key)s)

-- name: unpublished_events
-- The oldest unpublished events, in id order.
SELECT id, event_id, type, project_id, aggregate_type, aggregate_id, data, occurred_at
FROM outbox
WHERE published_at IS NULL
ORDER BY id
LIMIT %(limit)s

-- name: mark_published
-- Mark a published batch.
UPDATE outbox SET published_at = now() WHERE id = ANY(%(ids)s)
