-- name: delete_triggers
-- The contact's recorded rule triggers.
DELETE FROM followup_triggers WHERE project_id = %(project_id)s AND contact_id = %(contact_id)s
