-- What sent a message, recorded when it is queued (GET /v1/messages names it): a follow-up's sequence and
-- version (followup_enrollment_id and followup_step_index were there already; a one-off has neither), a
-- rule and, for a delayed rule, its execution. Plain ids, no foreign
-- keys: the message outlives a deleted rule or sequence, and its history stays readable.
ALTER TABLE messages
    ADD COLUMN sequence_id uuid,
    ADD COLUMN sequence_version integer,
    ADD COLUMN rule_id uuid,
    ADD COLUMN rule_execution_id uuid;

-- The message list pages newest first within a project, and every filter of it leads with the project
-- (the older contact and conversation indexes do not: they serve the engine's own reads by those ids).
CREATE INDEX messages_project_created_idx ON messages (project_id, created_at DESC, id DESC);
CREATE INDEX messages_project_contact_idx ON messages (project_id, contact_id, created_at DESC, id DESC);
CREATE INDEX messages_project_conversation_idx
    ON messages (project_id, conversation_id, created_at DESC, id DESC) WHERE conversation_id IS NOT NULL;
CREATE INDEX messages_project_enrollment_idx
    ON messages (project_id, followup_enrollment_id, created_at DESC, id DESC)
    WHERE followup_enrollment_id IS NOT NULL;
CREATE INDEX messages_project_sequence_idx
    ON messages (project_id, sequence_id, created_at DESC, id DESC) WHERE sequence_id IS NOT NULL;
CREATE INDEX messages_project_rule_idx
    ON messages (project_id, rule_id, created_at DESC, id DESC) WHERE rule_id IS NOT NULL;

