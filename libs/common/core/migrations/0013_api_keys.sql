-- API keys a project manages, and dashboard sessions that end.
--
-- 1. A key has a scope (what it may do: admin, write, read, events; docs/api.md "Scopes"), an optional
--    expiry (an expired key authenticates as nothing) and the time it was last used (written at most once
--    a minute per key: a conditional UPDATE, not a write per request). Every key that exists today could
--    do everything: it becomes an admin key. The uniqueness on (project_id, id) lets the sessions point at
--    a key of their own project.
ALTER TABLE api_keys
    ADD COLUMN scope text NOT NULL DEFAULT 'admin',
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN last_used_at timestamptz,
    ADD CONSTRAINT api_keys_scope_check CHECK (scope IN ('admin', 'write', 'read', 'events')),
    ADD CONSTRAINT api_keys_name_check CHECK (length(name) BETWEEN 1 AND 200),
    ADD CONSTRAINT api_keys_project_id_id_key UNIQUE (project_id, id);
ALTER TABLE api_keys ALTER COLUMN scope DROP DEFAULT;
DROP INDEX api_keys_project_idx;  -- (project_id, id) leads with the project and serves the list

-- 2. A signed-in dashboard browser: its cookie carries only an opaque random token, stored here as its
--    SHA-256. A session lives until expires_at (DASHBOARD_SESSION_SECONDS after signing in), its sign-out
--    (the row is deleted) or the revocation or expiry of the key it signed in with (checked on every
--    request; revoking deletes the key's sessions too). Expired rows are deleted by the retention job.
CREATE TABLE dashboard_sessions (
    project_id  uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    id          uuid NOT NULL DEFAULT gen_random_uuid(),
    api_key_id  uuid NOT NULL,
    token_hash  bytea NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (project_id, id),
    CONSTRAINT dashboard_sessions_token_hash_key UNIQUE (token_hash),
    FOREIGN KEY (project_id, api_key_id) REFERENCES api_keys (project_id, id) ON DELETE CASCADE
);
CREATE INDEX dashboard_sessions_key_idx ON dashboard_sessions (project_id, api_key_id);
CREATE INDEX dashboard_sessions_expires_idx ON dashboard_sessions (expires_at);
