-- name: delete_triggers
-- The contact's recorded rule triggers (their rule runs go with them).
DELETE FROM followup_triggers WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s

-- name: delete_webhook_deliveries
-- The webhook deliveries about the contact (their bodies carry what the event said of it).
DELETE FROM webhook_deliveries
WHERE project_id = %(project_id)s AND payload ->> 'contact_id' = %(contact_id)s::text
