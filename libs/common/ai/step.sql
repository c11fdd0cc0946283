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
