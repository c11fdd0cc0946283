-- The decision trace (why a rule fired or not, why a step did not send), kept in the rows already written,
-- so it lives and goes with them (retention deletes the row, and its trace with it):
-- * a rule run: its conditions as evaluated (each node's result, each condition's value) and, for a delayed
--   rule, the episode it belonged to;
-- * a delayed rule's execution: its conditions as re-checked when it fell due (the guard is skip_reason);
-- * a step run that did not send: the values the check or constraint that held it compared;
-- * a live enrollment deferred: the values of what it waits for (waiting_reason), until it moves on.
ALTER TABLE rule_runs ADD COLUMN trace jsonb;
ALTER TABLE rule_pending_executions ADD COLUMN trace jsonb;
ALTER TABLE followup_step_runs ADD COLUMN reason_values jsonb;
ALTER TABLE followup_enrollments ADD COLUMN waiting_values jsonb;
