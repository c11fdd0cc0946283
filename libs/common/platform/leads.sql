-- name: insert_lead
-- A new lead (nothing when a lead with this id exists).
INSERT INTO leads (id, project_id, contact_id, status, created_at, updated_at)
VALUES (%(id)s, %(project_id)s, %(contact_id)s, %(status)s, %(now)s, %(now)s)
ON CONFLICT (project_id, id) DO NOTHING
RETURNING id

-- name: lead_contact
-- The contact of a lead of the project (also: who holds a lead id that was given again).
SELECT contact_id FROM leads WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lock_lead
-- A lead's current status, locked (taken after its contact's lock, so lead events apply one at a time).
SELECT status, closed_at IS NOT NULL AS closed FROM leads
WHERE project_id = %(project_id)s AND id = %(id)s
FOR NO KEY UPDATE

-- name: set_lead_status
-- A lead's new status: closing it records when (once: a repeated close keeps the first time); any other
-- status reopens it.
UPDATE leads
SET status = %(status)s,
    closed_at = CASE WHEN %(closed)s THEN coalesce(closed_at, %(now)s) END,
    updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: lead_exists
-- Whether a lead belongs to the project (a deal may only point at the project's own leads).
SELECT 1 FROM leads WHERE project_id = %(project_id)s AND id = %(lead_id)s

-- name: set_deal_stage
-- A known deal's new stage; returns its contact and its stage before.
UPDATE deals d SET stage = %(stage)s, lead_id = coalesce(%(lead_id)s, d.lead_id), updated_at = %(now)s
FROM (SELECT id, stage FROM deals WHERE project_id = %(project_id)s AND id = %(id)s FOR NO KEY UPDATE) old
WHERE d.project_id = %(project_id)s AND d.id = old.id
RETURNING d.contact_id, old.stage

-- name: insert_deal
-- A new deal at its first stage, for a contact of the project; returns its contact.
INSERT INTO deals (id, project_id, contact_id, lead_id, stage, created_at, updated_at)
SELECT %(id)s, %(project_id)s, c.id, %(lead_id)s, %(stage)s, %(now)s, %(now)s
FROM contacts c
WHERE c.project_id = %(project_id)s AND c.id = %(contact_id)s AND c.erased_at IS NULL
ON CONFLICT (project_id, id) DO NOTHING
RETURNING contact_id, NULL::text AS stage
