-- The queues of the rules' path vacuumed early, as the release path's tables are (0012).
--
-- A trigger is written once by its event, then updated when it is leased (its due time moves, so its
-- pending index gets a second entry) and when it is processed (it leaves the pending index). A delayed
-- rule's execution and a webhook delivery change the same way, and a send in flight is updated, then
-- deleted. Each of those leaves dead entries in the partial index the queue's claim walks from its
-- oldest end, and the claim steps over every one of them until the table is vacuumed. With PostgreSQL's
-- default (a fifth of the table dead), a table that keeps its processed rows for the retention period holds
-- hundreds of thousands of dead entries before its first vacuum. These tables are vacuumed after 1-2 % of
-- their rows changed, without the default cost pauses; the sends in flight (a small table: each row is
-- deleted once its send is settled) after every 500 changes.
ALTER TABLE followup_triggers SET (
    autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE rule_pending_executions SET (
    autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE webhook_deliveries SET (
    autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE channel_sends SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);
