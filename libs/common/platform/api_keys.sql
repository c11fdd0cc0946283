-- name: insert_api_key
-- Store a new API key's hash, name, scope and expiry.
INSERT INTO api_keys (project_id, name, prefix, key_hash, scope, expires_at, created_at)
VALUES (%(project_id)s, %(name)s, %(prefix)s, %(key_hash)s, %(scope)s, %(expires_at)s, %(now)s)
RETURNING id, name, prefix, scope, created_at, last_used_at, expires_at, revoked_at

-- name: key_for_hash
-- The live key of a hash (not revoked, not expired), with when it was last used.
SELECT project_id, id, scope, last_used_at
FROM api_keys
WHERE key_hash = %(key_hash)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > %(now)s)

-- name: touch_api_key
-- Record a key's use, at most once a minute: a key used within the minute is not written again.
UPDATE api_keys SET last_used_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s
  AND (last_used_at IS NULL OR last_used_at <= %(now)s::timestamptz - interval '1 minute')

-- name: list_api_keys
-- A page of a project's keys (revoked ones too) in id order.
SELECT id, name, prefix, scope, created_at, last_used_at, expires_at, revoked_at
FROM api_keys
WHERE project_id = %(project_id)s AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
ORDER BY id
LIMIT %(limit)s

-- name: get_api_key
-- One of a project's keys.
SELECT id, name, prefix, scope, created_at, last_used_at, expires_at, revoked_at
FROM api_keys
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lock_live_admin_keys
-- The project's live admin keys, locked: revocations of admin keys run one at a time, so two of them
-- cannot each leave the other as the last one.
SELECT id
FROM api_keys
WHERE project_id = %(project_id)s AND scope = 'admin' AND revoked_at IS NULL
  AND (expires_at IS NULL OR expires_at > %(now)s)
ORDER BY id
FOR UPDATE

-- name: revoke_api_key
-- Revoke a key (a revoked key keeps its first revocation time).
UPDATE api_keys SET revoked_at = coalesce(revoked_at, %(now)s)
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id, name, prefix, scope, created_at, last_used_at, expires_at, revoked_at
