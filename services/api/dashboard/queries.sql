-- Read-only queries of the dashboard's pages that no domain function answers: what a page shows beside the
-- domain's own reads (a project's name, the contacts of a list's rows).

-- name: project_header
-- The signed-in project's name and time zone.
SELECT name, timezone FROM projects WHERE id = %(project_id)s

-- name: contacts_by_ids
-- Name and phone of some of the project's contacts (the rows of a list).
SELECT id, name, phone FROM contacts
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::uuid[])

-- name: sequence_names
-- Names of some of the project's sequences (the rows of a list).
SELECT id, name FROM followup_sequences
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::uuid[])
