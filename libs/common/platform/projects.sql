-- name: insert_project
-- Create a project.
INSERT INTO projects (name, timezone) VALUES (%(name)s, %(timezone)s) RETURNING id

-- name: insert_api_key
-- Store a new API key's hash.
INSERT INTO api_keys (project_id, name, prefix, key_hash)
VALUES (%(project_id)s, %(name)s, %(prefix)s, %(key_hash)s)

-- name: project_for_key
-- The project of a live API key.
SELECT project_id FROM api_keys WHERE key_hash = %(key_hash)s AND revoked_at IS NULL

-- name: project_exists
-- Whether the project exists (events over the broker name their project without an API key).
SELECT 1 FROM projects WHERE id = %(project_id)s

-- name: project_name
-- A project's name and time zone (what a page header shows).
SELECT name, timezone FROM projects WHERE id = %(project_id)s
