-- The queues of rules are claimed fairly across projects (libs/common/core/jobs.py's ROUND_ROBIN): the
-- claim walks the projects with pending work (a skip scan of this index, one descent per project) and takes
-- each one's oldest due items from the same index, so one project's backlog is never read to reach
-- another's single item.
CREATE INDEX followup_triggers_project_pending_idx ON followup_triggers (project_id, next_attempt_at, id)
    WHERE processed_at IS NULL;

-- An execution is claimable from the later of its due time and its lease's end (a backoff is a lease): the
-- index orders by that, so a project's executions backed off after a failure are not read to reach another's.
CREATE INDEX rule_pending_executions_project_due_idx
    ON rule_pending_executions (project_id, (greatest(due_at, coalesce(locked_until, due_at))), id)
    WHERE status = 'pending';

-- A project's share of a fair claim's batch of `batch` items among `projects` projects with due work: the
-- whole batch while their shares read at most 10,000 rows together (a project with less than its share
-- leaves the rest to the others), else the batch over their number, at least one; without round-robin,
-- the whole batch.
CREATE FUNCTION fair_share(batch integer, projects bigint, round_robin boolean) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN round_robin
            THEN greatest(ceil(batch::numeric / greatest(1, projects)),
                          least(batch, 10000 / greatest(1, projects)), 1)::bigint
            ELSE batch::bigint END;
