-- name: insert_trigger
-- A trigger, in the event's own transaction. The conversation's anchors at this moment go with it (when it
-- entered its status, its last incoming and outgoing messages, since when it waits for an answer): a
-- delayed rule's episode is keyed on them.
INSERT INTO followup_triggers (project_id, type, contact_id, conversation_id, payload, occurred_at,
                               next_attempt_at)
SELECT %(project_id)s, %(type)s, %(contact_id)s, %(conversation_id)s,
       %(payload)s::jsonb || jsonb_build_object('anchors', (
           SELECT jsonb_build_object('status_changed_at', v.status_changed_at,
                                     'last_incoming_message_id', v.last_incoming_message_id,
                                     'last_outgoing_message_id', v.last_outgoing_message_id,
                                     'waiting_since', v.waiting_since)
           FROM conversations v
           WHERE v.project_id = %(project_id)s AND v.id = %(conversation_id)s::uuid)),
       %(now)s, %(now)s
RETURNING id, public_id, type, project_id, contact_id, conversation_id, payload, occurred_at, attempts

-- name: trigger_shares
-- The projects with pending triggers in turns (jobs.RoundRobin), and the share of a batch each may take:
-- those after %(after)s in id order, wrapping around, at most %(projects)s of them, each one's due triggers
-- counted from the pending index (project_shares: a skip scan, one descent a project; the batch
-- water-filled). Read without locks: each project's claim locks its own.
SELECT project_id, share
FROM project_shares('followup_triggers', 'q.processed_at IS NULL', 'q.next_attempt_at <= $1',
                    %(after)s, %(projects)s, %(limit)s, %(now)s)

-- name: claim_triggers
-- One project's oldest due triggers, up to its share of the batch, from the pending index; triggers locked
-- by another worker are skipped. One project: a claim routed to one shard.
SELECT t.id, t.public_id, t.type, t.project_id, t.contact_id, t.conversation_id, t.payload, t.occurred_at,
       t.attempts
FROM followup_triggers t
WHERE t.project_id = %(project_id)s AND t.processed_at IS NULL AND t.next_attempt_at <= %(now)s
ORDER BY t.next_attempt_at, t.id
LIMIT %(share)s
FOR UPDATE SKIP LOCKED

-- name: lease
-- A project's triggers whose rules run next, each in a transaction of its own: no other worker claims them
-- meanwhile.
UPDATE followup_triggers SET next_attempt_at = %(until)s WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::bigint[])

-- name: lock_leased
-- A trigger under this worker's lease, locked while its rules run; nothing when it was processed meanwhile,
-- or taken over by another worker after the lease ran out (the lease's end and the attempts are its token).
SELECT id FROM followup_triggers
WHERE project_id = %(project_id)s AND id = %(id)s AND processed_at IS NULL AND next_attempt_at = %(until)s AND attempts = %(attempts)s
FOR UPDATE

-- name: already_run
-- The rules that already ran for these triggers of the project (a retried trigger skips them): one look-up
-- of the key per trigger, whatever the statistics say of the project's runs (without the fence, a plan made
-- while the table was small reads all the project's runs and filters them).
SELECT r.trigger_id, r.rule_id
FROM unnest(%(ids)s::bigint[]) AS i(id)
CROSS JOIN LATERAL (
    SELECT trigger_id, rule_id FROM rule_runs
    WHERE project_id = %(project_id)s AND trigger_id = i.id
    OFFSET 0
) r

-- name: insert_rule_runs
-- What each rule of the project did with its trigger, with its trace as matched.
INSERT INTO rule_runs (project_id, trigger_id, rule_id, outcome, detail, trace, ran_at)
SELECT %(project_id)s, r.trigger_id, r.rule_id, r.outcome, r.detail, r.trace, %(now)s
FROM jsonb_to_recordset(%(runs)s::jsonb)
     AS r(trigger_id bigint, rule_id uuid, outcome text, detail text, trace jsonb)
ON CONFLICT (project_id, trigger_id, rule_id) DO NOTHING

-- name: mark_processed
-- A project's triggers every matching rule ran for.
UPDATE followup_triggers SET processed_at = %(now)s, outcome = 'processed', last_error = NULL
WHERE project_id = %(project_id)s AND id = ANY(%(ids)s::bigint[])

-- name: mark_failed
-- A trigger whose attempt failed unexpectedly: retried after a backoff, or given up after its last attempt
-- (the job runner's verdict).
UPDATE followup_triggers
SET attempts = attempts + 1,
    last_error = %(error)s,
    next_attempt_at = %(next_attempt_at)s,
    processed_at = CASE WHEN %(given_up)s::boolean THEN %(now)s::timestamptz END,
    outcome = CASE WHEN %(given_up)s::boolean THEN 'failed' END
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING attempts, outcome
