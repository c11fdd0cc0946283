-- The rules' queues are claimed in turns across projects (libs/common/core/jobs.py's RoundRobin): a claim
-- walks the projects with pending work (a skip scan of the project-led index, one descent per project) and
-- takes each one's oldest due items from the same index, so one project's backlog is never read to reach
-- another's single item. The project-led index replaces the one led by time.
CREATE INDEX followup_triggers_project_pending_idx ON followup_triggers (project_id, next_attempt_at, id)
    WHERE processed_at IS NULL;
DROP INDEX followup_triggers_pending_idx;

-- An execution is claimable from the later of its due time and its lease's end (a backoff is a lease): the
-- index orders each project's pending executions by that, so a project's executions backed off after a
-- failure are not read to reach its due ones, nor another project's.
CREATE INDEX rule_pending_executions_project_ready_idx
    ON rule_pending_executions (project_id, (greatest(due_at, coalesce(locked_until, due_at))), id)
    WHERE status = 'pending';
