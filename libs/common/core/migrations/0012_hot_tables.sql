-- The release path's tables, tuned for the rate they change at.
--
-- 1. When a contact last wrote is kept on the contact, set in the reply's own transaction (the contact is
--    locked there already). The release step reads it with the contact row it share-locks anyway, for the
--    reply backstop, the "no reply" conditions and the WhatsApp service window, instead of a max() over
--    the contact's messages per step: the step no longer reads a contact's message history, so its cost
--    does not depend on how many messages there are or on how fresh their statistics are.
ALTER TABLE contacts ADD COLUMN last_inbound_at timestamptz;

UPDATE contacts c SET last_inbound_at = m.last_inbound_at
FROM (SELECT contact_id, max(created_at) AS last_inbound_at FROM messages
      WHERE direction = 'inbound' GROUP BY contact_id) m
WHERE c.id = m.contact_id;

-- 2. The per-message usage ledger goes. Nothing read it and nothing ever purged it, and every queued
--    message paid a row, two index entries and a foreign key check for it. A project's usage is its monthly
--    count in usage_counters (what the quota reads, kept in the same statement); each message's own record
--    is its message row.
DROP TABLE usage;

-- 3. Autovacuum per table. PostgreSQL's defaults vacuum a table once a fifth of it is dead. An enrollment
--    row is rewritten at every step, an outbox row when it is published, a conversation when a follow-up
--    is queued into it: with a large table, a fifth is hundreds of thousands of dead rows and dead claim
--    index entries before the first vacuum. These tables are vacuumed (and analysed, so the plans follow
--    a backlog as it grows) after 1-5 % of their rows changed, and without the default cost pauses. The
--    counter rows (a handful of rows updated by every step) are vacuumed after a few hundred updates.
--
-- 4. Fill factor: rows updated in place without touching an indexed column (a conversation's last
--    outgoing message, a contact's last inbound time, a counter, a pacing slot, an enrollment's lease)
--    stay on their page as heap-only tuples when the page has room, so no index gets a new entry. The
--    setting applies to pages written from now on.
ALTER TABLE followup_enrollments SET (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE messages SET (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE conversations SET (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05
);
ALTER TABLE contacts SET (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05
);
ALTER TABLE message_counters SET (
    fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE usage_counters SET (
    fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE followup_instance_pacing SET (
    fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);
