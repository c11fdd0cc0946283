-- A project's live enrollments (active or paused), counted so that a plan limit reads a sum of a few rows
-- instead of counting every live enrollment on each enrollment. Only two statements change how many are
-- live: the insert of an enrollment (+1 each) and the finish of live ones (-1 each; pause and resume keep
-- an enrollment live, and retention deletes finished ones only). Each adds its delta in the same statement
-- (a data-modifying CTE), to one of 16 shards of the project: the shard of the session
-- (pg_backend_pid() & 15), so that a transaction touches one counter row per project whatever it changes
-- (no two transactions can lock two counter rows in opposite orders) and concurrent writers seldom meet on
-- one. A shard may go negative (an enrollment counted in on one session, out on another); the count is
-- the sum of the project's shards. The retention job recounts and corrects any drift.
CREATE TABLE followup_live_counters (
    project_id uuid     NOT NULL,
    shard      smallint NOT NULL,
    live       bigint   NOT NULL,
    PRIMARY KEY (project_id, shard)
);

ALTER TABLE followup_live_counters SET (
    fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);

-- the enrollments already live
INSERT INTO followup_live_counters (project_id, shard, live)
SELECT project_id, 0, count(*)
FROM followup_enrollments
WHERE status IN ('active', 'paused')
GROUP BY project_id;
