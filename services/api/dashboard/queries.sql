-- Read-only queries of the dashboard's pages that no domain function answers: what a page shows beside the
-- domain's own reads (a project's name, the contacts of a list's rows, a contact's pending rule executions).

-- name: project_header
-- The signed-in project's name and time zone.
SELECT name, timezone FROM projects WHERE id = %(project_id)s

-- name: contacts_by_ids
-- Name and phone of some of the project's contacts (the rows of a list).
SELECT id, name, phone FROM contacts
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::uuid[])

-- name: sequence_names
-- Names of some of the project's sequences (the rows of a list).
SELECT id, name FROM followup_sequences
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::uuid[])

-- name: pending_executions_for_contact
-- A contact's delayed rule executions still to come (pending, or being run), soonest first.
SELECT e.id, e.rule_id, r.name AS rule_name, e.conversation_id, e.due_at, e.status, e.episode_key
FROM rule_pending_executions e
JOIN rules r ON r.id = e.rule_id
WHERE e.project_id = %(project_id)s AND e.contact_id = %(contact_id)s
  AND e.status IN ('pending', 'processing', 'executing')
ORDER BY e.due_at, e.id
LIMIT 100

-- name: month_ai_tokens
-- The tokens the project's AI steps used this calendar month (UTC).
SELECT coalesce(sum(tokens), 0)::bigint FROM ai_budget_ledger
WHERE project_id = %(project_id)s AND kind = 'followup'
  AND occurred_at >= date_trunc('month', %(now)s AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
