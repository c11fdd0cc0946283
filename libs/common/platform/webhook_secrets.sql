-- name: webhook_secret
-- The key that signs a project's webhooks, and until when the one it replaced signs them too.
SELECT webhook_secret AS secret,
       CASE WHEN webhook_secret_previous_until > %(now)s THEN webhook_secret_previous_until END
           AS previous_valid_until
FROM projects
WHERE id = %(project_id)s

-- name: rotate_webhook_secret
-- A new signing key; the one it replaces stays valid until the overlap ends (none: it ends at once). A key
-- older than that (a rotation during an overlap) is dropped.
UPDATE projects
SET webhook_secret = %(secret)s,
    webhook_secret_previous = CASE WHEN %(until)s::timestamptz > %(now)s THEN webhook_secret END,
    webhook_secret_previous_until = CASE WHEN %(until)s::timestamptz > %(now)s THEN %(until)s::timestamptz END
WHERE id = %(project_id)s
RETURNING webhook_secret AS secret, webhook_secret_previous_until AS previous_valid_until
