-- name: insert_number
-- Register a sending number.
INSERT INTO numbers (project_id, phone, name, status, is_default, portfolio_id, created_at, updated_at)
VALUES (%(project_id)s, %(phone)s, %(name)s, %(status)s, false, %(portfolio_id)s, %(now)s, %(now)s)
RETURNING id, phone, name, status, is_default, portfolio_id, created_at, updated_at

-- name: get_number
-- One number of a project.
SELECT id, phone, name, status, is_default, portfolio_id, created_at, updated_at
FROM numbers
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lock_number
-- One number of a project, locked for a change.
SELECT id, phone, name, status, is_default, portfolio_id, created_at, updated_at
FROM numbers
WHERE project_id = %(project_id)s AND id = %(id)s
FOR NO KEY UPDATE

-- name: list_numbers
-- A page of a project's numbers in id order.
SELECT id, phone, name, status, is_default, portfolio_id, created_at, updated_at
FROM numbers
WHERE project_id = %(project_id)s AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
ORDER BY id
LIMIT %(limit)s

-- name: clear_default
-- The project's other numbers stop being the default (one default per project).
UPDATE numbers SET is_default = false, updated_at = %(now)s
WHERE project_id = %(project_id)s AND is_default AND id <> %(id)s

-- name: update_number
-- A number's new name, default flag or status.
UPDATE numbers
SET name = %(name)s, is_default = %(is_default)s, status = %(status)s, portfolio_id = %(portfolio_id)s,
    updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id, phone, name, status, is_default, portfolio_id, created_at, updated_at
