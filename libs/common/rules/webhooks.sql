-- name: insert_delivery
-- Queue a webhook delivery, due at once.
INSERT INTO webhook_deliveries (project_id, rule_id, trigger_id, url, payload, status, attempts, next_attempt_at,
                                created_at, updated_at)
VALUES (%(project_id)s, %(rule_id)s, %(trigger_id)s, %(url)s, %(payload)s, 'pending', 0, %(now)s, %(now)s, %(now)s)
RETURNING id

-- name: claim_delivery
-- Claim a due pending delivery of the project for one attempt (SKIP LOCKED: a busy one is left alone): the
-- attempt is counted and the row leased (next_attempt_at moved past the call's deadline), with the
-- project's secret and, while a rotation's overlap runs, the secret it replaced.
WITH picked AS (
    SELECT id FROM webhook_deliveries
    WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'pending' AND next_attempt_at <= %(now)s
      AND attempts < %(max_attempts)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE webhook_deliveries d
    SET attempts = d.attempts + 1, next_attempt_at = %(lease_until)s, updated_at = %(now)s
    FROM picked WHERE d.project_id = %(project_id)s AND d.id = picked.id
    RETURNING d.id, d.project_id, d.rule_id, d.url, d.payload, d.attempts
)
SELECT claimed.id, claimed.project_id, claimed.rule_id, claimed.url, claimed.payload, claimed.attempts,
       p.webhook_secret AS secret,
       CASE WHEN p.webhook_secret_previous_until > %(now)s THEN p.webhook_secret_previous END AS previous_secret
FROM claimed JOIN projects p ON p.id = claimed.project_id

-- name: record_attempt
-- Record an attempt's result, unless the lease ran out and another claim counted a later attempt.
UPDATE webhook_deliveries
SET status = %(status)s, next_attempt_at = %(next_attempt_at)s, last_status_code = %(status_code)s,
    last_error = %(error)s, delivered_at = %(delivered_at)s, updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s AND status = 'pending' AND attempts = %(attempts)s
RETURNING id, project_id, rule_id, status, attempts, next_attempt_at, last_status_code, last_error, delivered_at

-- name: delivery_state
-- A delivery's state (the worker's view).
SELECT id, project_id, rule_id, status, attempts, next_attempt_at, last_status_code, last_error, delivered_at
FROM webhook_deliveries
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: due_deliveries
-- Pending deliveries due by now and not at their last attempt, fair across projects: each project's oldest
-- first, then each project's second, ...; at most per_project of one project's, none of the deliveries in
-- flight (busy) and none of a project whose in-flight slots are full (saturated).
WITH due AS (
    SELECT id, project_id, next_attempt_at,
           row_number() OVER (PARTITION BY project_id ORDER BY next_attempt_at, id) AS turn
    FROM webhook_deliveries
    WHERE status = 'pending' AND next_attempt_at <= %(now)s AND attempts < %(max_attempts)s
      AND id <> ALL (%(busy)s::uuid[]) AND project_id <> ALL (%(saturated)s::uuid[])
)
SELECT id, project_id FROM due
WHERE turn <= %(per_project)s
ORDER BY turn, next_attempt_at, id
LIMIT %(limit)s

-- name: give_up_exhausted
-- Give up the deliveries whose last attempt was claimed but its result never recorded (the lease ran out):
-- a delivery is never claimed past its maximum attempts.
UPDATE webhook_deliveries
SET status = 'failed', next_attempt_at = NULL, last_error = coalesce(last_error, 'attempts_exhausted'),
    updated_at = %(now)s
WHERE status = 'pending' AND attempts >= %(max_attempts)s AND next_attempt_at <= %(now)s
RETURNING id, project_id

-- name: get_delivery
-- One delivery of the project.
SELECT id, project_id, rule_id, trigger_id, url, payload, status, attempts, next_attempt_at, last_status_code,
       last_error, created_at, delivered_at, updated_at
FROM webhook_deliveries
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: list_deliveries
-- A page of the project's deliveries in id order, optionally of one rule or in one status.
SELECT id, project_id, rule_id, trigger_id, url, payload, status, attempts, next_attempt_at, last_status_code,
       last_error, created_at, delivered_at, updated_at
FROM webhook_deliveries
WHERE project_id = %(project_id)s
  AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
  AND (%(rule_id)s::uuid IS NULL OR rule_id = %(rule_id)s::uuid)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
ORDER BY id
LIMIT %(limit)s
