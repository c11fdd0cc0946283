-- A campaign's follow-ups name their campaign (GET /v1/messages: origin.campaign_id, ?campaign_id=): the
-- enrollment a released recipient made records its campaign, and each message of it is queued with the id.
-- A plain id, no foreign key (as the message's other origin ids: the history outlives the campaign).
ALTER TABLE followup_enrollments ADD COLUMN campaign_id uuid;
ALTER TABLE messages ADD COLUMN campaign_id uuid;

-- Campaign enrollments made before recorded their campaign only in their variables (the releaser sets
-- campaign_id there, a uuid): their enrollments and messages take it from there.
UPDATE followup_enrollments SET campaign_id = (variables ->> 'campaign_id')::uuid
WHERE source = 'campaign'
  AND variables ->> 'campaign_id' ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$';
UPDATE messages m SET campaign_id = e.campaign_id
FROM followup_enrollments e
WHERE e.campaign_id IS NOT NULL AND m.project_id = e.project_id AND m.followup_enrollment_id = e.id;

-- The message list's campaign filter walks the project's campaign messages newest first.
CREATE INDEX messages_project_campaign_idx
    ON messages (project_id, campaign_id, created_at DESC, id DESC) WHERE campaign_id IS NOT NULL;
