-- Conversation, lead and deal ids are the platform's own (a client gives them), so they are unique within
-- a project, not across projects: with a global key, project A could learn that B holds an id (its
-- create answered 409) and take an id B will need. Each is keyed by (project_id, id), and whatever points
-- at one points at it within its own project. Setting null on delete clears only the id column
-- (PostgreSQL 15+), never the project_id the row needs.

ALTER TABLE messages DROP CONSTRAINT messages_conversation_id_fkey;
ALTER TABLE rule_pending_executions DROP CONSTRAINT rule_pending_executions_conversation_id_fkey;
ALTER TABLE deals DROP CONSTRAINT deals_lead_id_fkey;

ALTER TABLE conversations DROP CONSTRAINT conversations_pkey, ADD PRIMARY KEY (project_id, id);
ALTER TABLE leads DROP CONSTRAINT leads_pkey, ADD PRIMARY KEY (project_id, id);
ALTER TABLE deals DROP CONSTRAINT deals_pkey, ADD PRIMARY KEY (project_id, id);

ALTER TABLE messages ADD CONSTRAINT messages_conversation_id_fkey
    FOREIGN KEY (project_id, conversation_id) REFERENCES conversations (project_id, id)
    ON DELETE SET NULL (conversation_id);
ALTER TABLE rule_pending_executions ADD CONSTRAINT rule_pending_executions_conversation_id_fkey
    FOREIGN KEY (project_id, conversation_id) REFERENCES conversations (project_id, id)
    ON DELETE SET NULL (conversation_id);
ALTER TABLE deals ADD CONSTRAINT deals_lead_id_fkey
    FOREIGN KEY (project_id, lead_id) REFERENCES leads (project_id, id)
    ON DELETE SET NULL (lead_id);
