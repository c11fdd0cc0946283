-- Trigger ids came from one global sequence, so the ids a project saw (an event's answer, a webhook's body,
-- a rule's runs, a delivery) told it how many triggers every other project recorded meanwhile. What a
-- project sees is now the trigger's public_id, a random uuid; the bigint id stays the internal key (rule
-- runs, delayed executions, the claim's arrays). No index: nothing looks a trigger up by its public id.
-- (Adding a column with a volatile default rewrites followup_triggers once; it holds a few days of rows.)
ALTER TABLE followup_triggers ADD COLUMN public_id uuid NOT NULL DEFAULT gen_random_uuid();

-- A delivery names the trigger it came of by that public id (the column is only shown, never joined on).
ALTER TABLE webhook_deliveries ADD COLUMN trigger_public_id uuid;
UPDATE webhook_deliveries d SET trigger_public_id = t.public_id
FROM followup_triggers t WHERE t.id = d.trigger_id;
ALTER TABLE webhook_deliveries DROP COLUMN trigger_id;
ALTER TABLE webhook_deliveries RENAME COLUMN trigger_public_id TO trigger_id;

-- Rotating the webhook signing secret keeps the one it replaced valid until webhook_secret_previous_until:
-- deliveries meanwhile carry a signature by each (receivers accept either), then by the new one only.
ALTER TABLE projects
    ADD COLUMN webhook_secret_previous text,
    ADD COLUMN webhook_secret_previous_until timestamptz,
    ADD CONSTRAINT projects_webhook_secret_previous_check
        CHECK ((webhook_secret_previous IS NULL) = (webhook_secret_previous_until IS NULL));
