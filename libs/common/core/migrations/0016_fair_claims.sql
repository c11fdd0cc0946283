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
