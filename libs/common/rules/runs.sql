-- What a rule did with its triggers: the runs list and one run with its trace. A run is named by its
-- trigger's public id (the internal one would count every project's triggers).

-- name: rule_runs
-- What a rule did with its latest triggers, newest first, with each run's trace (for its short form).
SELECT t.public_id AS trigger_id, r.outcome, r.detail, r.ran_at, r.trace
FROM rule_runs r JOIN followup_triggers t ON t.project_id = r.project_id AND t.id = r.trigger_id
WHERE r.project_id = %(project_id)s AND r.rule_id = %(rule_id)s
ORDER BY r.ran_at DESC, r.trigger_id DESC
LIMIT %(limit)s

-- name: rule_run
-- One run of the project's rule, by its trigger's public id: the trigger it ran for, its outcome and trace.
SELECT t.public_id AS trigger_id, t.type AS event, t.contact_id, t.conversation_id, t.occurred_at,
       r.outcome, r.detail, r.ran_at, r.trace
FROM rule_runs r JOIN followup_triggers t ON t.project_id = r.project_id AND t.id = r.trigger_id
WHERE r.project_id = %(project_id)s AND r.rule_id = %(rule_id)s AND t.project_id = %(project_id)s
  AND t.public_id = %(run_id)s

-- name: run_execution
-- The execution a delayed rule's run recorded or joined: its rule's, conversation's and episode's (the
-- unique key), with its trace when it fell due.
SELECT e.id, e.status, e.due_at, e.executed_at, e.skip_reason, e.message_id, e.trace
FROM rule_pending_executions e
WHERE e.project_id = %(project_id)s AND e.rule_id = %(rule_id)s
  AND e.conversation_id IS NOT DISTINCT FROM %(conversation_id)s::uuid AND e.episode_key = %(episode_key)s
