-- name: upsert_channel
-- Set a number's provider, ids and credentials (replacing what it had).
INSERT INTO channel_numbers (project_id, number_id, provider, account_id, sender, credentials, created_at,
                             updated_at)
VALUES (%(project_id)s, %(number_id)s, %(provider)s, %(account_id)s, %(sender)s, %(credentials)s, %(now)s,
        %(now)s)
ON CONFLICT (project_id, number_id) DO UPDATE
SET provider = excluded.provider, account_id = excluded.account_id, sender = excluded.sender,
    credentials = excluded.credentials, updated_at = excluded.updated_at
RETURNING project_id, number_id, provider, account_id, sender, credentials, created_at, updated_at

-- name: get_channel
-- A number's channel, credentials included (never returned by the API).
SELECT project_id, number_id, provider, account_id, sender, credentials, created_at, updated_at
FROM channel_numbers
WHERE project_id = %(project_id)s AND number_id = %(number_id)s

-- name: channel_of_webhook
-- The channel a provider's webhook names by its number id: the lookup its signature is checked against
-- (the project comes from here, as a request's comes from its API key).
SELECT project_id, number_id, provider, account_id, sender, credentials, created_at, updated_at
FROM channel_numbers
WHERE number_id = %(number_id)s

-- name: delete_channel
-- Forget a number's channel (the send lane no longer sends its messages).
DELETE FROM channel_numbers
WHERE project_id = %(project_id)s AND number_id = %(number_id)s
RETURNING number_id
