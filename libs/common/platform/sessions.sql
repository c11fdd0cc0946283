-- name: insert_session
-- Start a dashboard session: only the hash of its token is stored.
INSERT INTO dashboard_sessions (project_id, api_key_id, token_hash, created_at, expires_at)
VALUES (%(project_id)s, %(api_key_id)s, %(token_hash)s, %(now)s, %(expires_at)s)
RETURNING id

-- name: session_for_token
-- A token's session while it, and the key it signed in with, are live (not revoked, not expired); with
-- the project's name for the page header.
SELECT s.project_id, s.id, s.api_key_id, k.scope, s.expires_at, p.name
FROM dashboard_sessions s
JOIN api_keys k ON k.project_id = s.project_id AND k.id = s.api_key_id
JOIN projects p ON p.id = s.project_id
WHERE s.token_hash = %(token_hash)s AND s.expires_at > %(now)s
  AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > %(now)s)

-- name: delete_session
-- Sign out: the session's row goes.
DELETE FROM dashboard_sessions WHERE token_hash = %(token_hash)s

-- name: delete_key_sessions
-- The sessions signed in with a key (it was revoked).
DELETE FROM dashboard_sessions WHERE project_id = %(project_id)s AND api_key_id = %(api_key_id)s

-- name: purge_expired_sessions
-- A batch of sessions past their expiry (the retention job): picked through the expiry index, deleted by
-- their token's unique index.
DELETE FROM dashboard_sessions
WHERE token_hash = ANY(ARRAY(
    SELECT token_hash FROM dashboard_sessions
    WHERE expires_at <= %(now)s::timestamptz
    ORDER BY expires_at
    LIMIT %(limit)s
))
