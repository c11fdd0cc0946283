-- name: insert_project
-- Create a project.
INSERT INTO projects (name, timezone) VALUES (%(name)s, %(timezone)s) RETURNING id

-- name: project_exists
-- Whether the project exists (events over the broker name their project without an API key).
SELECT 1 FROM projects WHERE id = %(project_id)s

-- name: project_name
-- A project's name and time zone (what a page header shows).
SELECT name, timezone FROM projects WHERE id = %(project_id)s

-- name: set_timezone
-- Set a project's time zone (an IANA name, checked by the caller).
UPDATE projects SET timezone = %(timezone)s WHERE id = %(project_id)s

-- name: project_ids
-- Every project's id, in order (the retention job walks them).
SELECT id FROM projects ORDER BY id
