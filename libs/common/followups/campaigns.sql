-- name: put_campaign
-- A campaign's no-reply sequence (created or replaced).
INSERT INTO followup_campaigns (id, project_id, sequence_id, name, created_at, updated_at)
VALUES (%(id)s, %(project_id)s, %(sequence_id)s, %(name)s, %(now)s, %(now)s)
ON CONFLICT (project_id, id) DO UPDATE
SET sequence_id = excluded.sequence_id, name = excluded.name, updated_at = excluded.updated_at
RETURNING id, sequence_id, name, created_at, updated_at

-- name: get_campaign
-- One campaign of a project.
SELECT id, sequence_id, name, created_at, updated_at FROM followup_campaigns
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: campaign_names
-- Names of some of the project's campaigns (a page's messages); a campaign without a name is left out.
SELECT id, name FROM followup_campaigns
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::uuid[]) AND name IS NOT NULL
