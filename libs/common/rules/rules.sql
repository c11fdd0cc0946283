-- name: insert_rule
-- Create a rule; without a position it goes last.
INSERT INTO rules (project_id, name, event, conditions, actions, execution_delay_minutes,
                   delay_in_business_hours, active, position, created_at, updated_at)
SELECT %(project_id)s, %(name)s, %(event)s, %(conditions)s, %(actions)s, %(execution_delay_minutes)s,
       %(delay_in_business_hours)s, %(active)s,
       coalesce(%(position)s::integer,
                (SELECT coalesce(max(r.position) + 1, 0) FROM rules r WHERE r.project_id = %(project_id)s)),
       %(now)s, %(now)s
RETURNING id, name, event, conditions, actions, execution_delay_minutes, delay_in_business_hours, active,
          position, created_at, updated_at

-- name: lock_rule
-- One rule of a project, locked for an update.
SELECT id, name, event, conditions, actions, execution_delay_minutes, delay_in_business_hours, active, position, created_at, updated_at
FROM rules
WHERE project_id = %(project_id)s AND id = %(id)s
FOR UPDATE

-- name: get_rule
-- One rule of a project.
SELECT id, name, event, conditions, actions, execution_delay_minutes, delay_in_business_hours, active, position, created_at, updated_at
FROM rules
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: update_rule
-- Write a rule's fields as the caller merged them.
UPDATE rules
SET name = %(name)s, event = %(event)s, conditions = %(conditions)s, actions = %(actions)s,
    execution_delay_minutes = %(execution_delay_minutes)s, delay_in_business_hours = %(delay_in_business_hours)s,
    active = %(active)s, position = %(position)s,
    updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id, name, event, conditions, actions, execution_delay_minutes, delay_in_business_hours, active,
          position, created_at, updated_at

-- name: delete_rule
-- Delete a rule (its pending executions and runs go with it).
DELETE FROM rules WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id

-- name: list_rules
-- A page of a project's rules in the order they run: position, then creation. The cursor is the last
-- rule's id (its position and creation time are looked up).
SELECT r.id, r.name, r.event, r.conditions, r.actions, r.execution_delay_minutes, r.delay_in_business_hours, r.active, r.position,
       r.created_at, r.updated_at
FROM rules r
WHERE r.project_id = %(project_id)s
  AND (%(event)s::text IS NULL OR r.event = %(event)s::text)
  AND (%(active)s::boolean IS NULL OR r.active = %(active)s::boolean)
  AND (%(after)s::uuid IS NULL
       OR (r.position, r.created_at, r.id) > (SELECT a.position, a.created_at, a.id FROM rules a
                                             WHERE a.project_id = %(project_id)s AND a.id = %(after)s::uuid))
ORDER BY r.position, r.created_at, r.id
LIMIT %(limit)s

-- name: active_rules
-- The project's active rules in the order they run (the per-process rule cache loads them).
SELECT id, name, event, conditions, actions, execution_delay_minutes, delay_in_business_hours, active, position, created_at, updated_at
FROM rules
WHERE project_id = %(project_id)s AND active
ORDER BY position, created_at, id

-- name: lock_rule_count
-- Serialise the creates of one project's rules (a transaction-scoped advisory lock), so the count that
-- follows holds until the insert commits.
SELECT pg_advisory_xact_lock(hashtextextended('rules:' || %(project_id)s::text, 0))

-- name: count_rules
-- How many rules a project holds (active or not).
SELECT count(*) FROM rules WHERE project_id = %(project_id)s
