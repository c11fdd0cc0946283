-- name: context
-- What the prompt of a leased AI step needs (read without locks: the model is called holding none): the
-- enrollment (still at the step, under the same fence), its contact and the step's version.
SELECT e.id, e.project_id, e.contact_id, e.conversation_id, e.version_id, e.step_index, e.variables,
       c.name AS contact_name, c.attributes AS contact_attributes, p.timezone AS project_timezone
FROM followup_enrollments e
JOIN contacts c ON c.id = e.contact_id
JOIN projects p ON p.id = e.project_id
WHERE e.id = %(id)s AND e.status = 'active' AND e.step_index = %(step_index)s AND e.attempts = %(fence)s

-- name: history
-- The conversation's last messages, newest first (the enrollment's conversation, else the contact's).
SELECT m.direction, m.source, m.body, m.created_at
FROM messages m
WHERE m.contact_id = %(contact_id)s
  AND (%(conversation_id)s::uuid IS NULL OR m.conversation_id = %(conversation_id)s::uuid)
  AND m.body IS NOT NULL AND m.status <> 'CANCELLED'
ORDER BY m.created_at DESC
LIMIT %(limit)s

-- name: month_tokens
-- The tokens the project's AI steps used this calendar month (UTC).
SELECT coalesce(sum(tokens), 0) FROM ai_budget_ledger
WHERE project_id = %(project_id)s AND kind = 'followup'
  AND occurred_at >= date_trunc('month', %(now)s AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'

-- name: record_call
-- One model call of an AI step, in the ledger.
INSERT INTO ai_budget_ledger (project_id, kind, tokens, prompt_tokens, completion_tokens, cost_micros,
                              reference_id, outcome, occurred_at)
VALUES (%(project_id)s, 'followup', %(prompt_tokens)s::bigint + %(completion_tokens)s::bigint, %(prompt_tokens)s,
        %(completion_tokens)s, %(cost_micros)s, %(enrollment_id)s, %(outcome)s, %(now)s)
