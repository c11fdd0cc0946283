-- name: preview_contact
-- The contact a preview is for, by id or else by phone (the project's, not erased; never locked), and the
-- zones its times are read in (the contact's, else the project's).
SELECT c.id, c.timezone, p.timezone AS project_timezone
FROM contacts c
JOIN projects p ON p.id = c.project_id
WHERE c.project_id = %(project_id)s AND c.erased_at IS NULL
  AND c.id = coalesce(%(contact_id)s::uuid, (SELECT x.id FROM contacts x
                                             WHERE x.project_id = %(project_id)s AND x.phone = %(phone)s))
