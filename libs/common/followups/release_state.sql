-- name: release_state
-- Share-lock the claimed enrollment's contact (a contact locked by a stop path is skipped: the releaser
-- never waits) and read what the checks, the only_if conditions, the sending constraints and the templates
-- need. The project row is not locked here: nothing takes it FOR UPDATE (a plan-limited enrollment takes
-- FOR NO KEY UPDATE), so the foreign key checks of the rows a queued step inserts never wait for it, and
-- the hot row is spared a lock per step. The counts behind the caps are read only when the cap is set:
-- the in-flight and backlog counts from message_counters (kept by a trigger), the per-contact count stops
-- at the cap. When the contact last wrote is the contact's own column (the reply sets it), so the step
-- never reads the messages table for it; when the contact was last sent a message (whatever sent it) is
-- read only when the project spaces them (min_recipient_gap_seconds, one probe of the contact's messages).
-- The number to send from: the enrollment's, the sequence's fixed one, the contact's last conversation's,
-- the project's default, then any connected one; and that number's pacing widened by a rate limit
-- (followups.pacing).
-- The conversation a queued message threads into is locked here too (the same choice as the platform's
-- lock_open_conversation: the enrollment's own while open, else the contact's newest open one, locked SKIP
-- LOCKED), so queueing costs no round trip of its own: open_conversation_busy says one is open but another
-- transaction holds it (the step is deferred busy), a null id with busy false that none is open (the
-- platform opens one).
SELECT c.opted_out_at IS NOT NULL AS opted_out,
       c.erased_at IS NOT NULL AS erased,
       c.undeliverable_at IS NOT NULL AS undeliverable,
       c.marketing_limited_until,
       c.name, c.phone, c.attributes, c.timezone, c.consent,
       p.timezone AS project_timezone,
       p.plan_active,
       s.status AS sequence_status,
       CASE WHEN c.last_inbound_at > %(enrolled_at)s THEN c.last_inbound_at END AS replied_at,
       CASE WHEN %(last_message_id)s::uuid IS NOT NULL THEN
           (SELECT m.status FROM messages m WHERE m.project_id = c.project_id AND m.id = %(last_message_id)s)
       END AS last_message_status,
       c.last_inbound_at,
       coalesce(fs.min_recipient_gap_seconds, %(default_recipient_gap)s) AS min_recipient_gap_seconds,
       CASE WHEN coalesce(fs.min_recipient_gap_seconds, %(default_recipient_gap)s) > 0 THEN
           (SELECT m.created_at FROM messages m
            WHERE m.project_id = c.project_id AND m.contact_id = c.id AND m.direction = 'outbound'
              AND m.status <> 'CANCELLED'
            ORDER BY m.created_at DESC LIMIT 1)
       END AS last_outbound_at,
       EXISTS (SELECT 1 FROM numbers n WHERE n.project_id = c.project_id) AS has_numbers,
       num.id AS number_id, num.portfolio_id,
       CASE WHEN fs.max_in_flight_per_number IS NOT NULL AND num.id IS NOT NULL THEN
           (SELECT coalesce(sum(mc.messages), 0) FROM message_counters mc
            WHERE mc.project_id = c.project_id AND mc.kind = 'number_in_flight' AND mc.owner_id = num.id)
       END AS in_flight,
       CASE WHEN fs.max_send_lane_backlog IS NOT NULL THEN
           (SELECT coalesce(sum(mc.messages), 0) FROM message_counters mc
            WHERE mc.project_id = c.project_id AND mc.kind = 'project_queued' AND mc.owner_id = c.project_id)
       END AS backlog,
       CASE WHEN fs.monthly_message_quota IS NOT NULL THEN
           (SELECT coalesce(sum(u.messages), 0) FROM usage_counters u
            WHERE u.project_id = c.project_id AND u.month = date_trunc('month', %(now)s AT TIME ZONE 'UTC')::date)
       END AS month_messages,
       CASE WHEN fs.max_per_contact_24h IS NOT NULL OR fs.max_per_contact_day IS NOT NULL THEN
           ARRAY(SELECT m.created_at FROM messages m
                 WHERE m.project_id = c.project_id AND m.contact_id = c.id AND m.direction = 'outbound'
                   AND m.source <> 'human' AND m.status <> 'CANCELLED' AND m.created_at > %(now)s - interval '24 hours'
                 ORDER BY m.created_at DESC
                 LIMIT greatest(fs.max_per_contact_24h, fs.max_per_contact_day))
       END AS recent_messages,
       fs.send_window, coalesce(fs.consent_mode, 'off') AS consent_mode,
       coalesce(fs.service_window, 'off') AS service_window, fs.max_per_contact_24h, fs.max_per_contact_day,
       coalesce(fs.send_delay_ms, 0) AS send_delay_ms, fs.max_in_flight_per_number, fs.monthly_message_quota,
       fs.max_send_lane_backlog,
       th.id AS open_conversation_id, th.number_id AS open_conversation_number_id,
       th.id IS NULL AND EXISTS (SELECT 1 FROM conversations v
                                     WHERE v.project_id = c.project_id AND v.contact_id = c.id
                                       AND v.status <> 'resolved') AS open_conversation_busy,
       coalesce(pace.widened_gap_ms, 0) AS widened_gap_ms, pace.widened_at
FROM contacts c
JOIN projects p ON p.id = c.project_id
LEFT JOIN followup_sequences s ON s.project_id = c.project_id AND s.id = %(sequence_id)s
LEFT JOIN followup_settings fs ON fs.project_id = c.project_id
LEFT JOIN LATERAL (
    SELECT n.id, n.portfolio_id FROM numbers n
    WHERE n.project_id = c.project_id AND n.status = 'connected'
    ORDER BY n.id = %(number_id)s::uuid DESC NULLS LAST,
             n.id = %(fixed_number_id)s::uuid DESC NULLS LAST,
             n.id = (SELECT v.number_id FROM conversations v
                     WHERE v.project_id = c.project_id AND v.contact_id = c.id
                     ORDER BY v.created_at DESC LIMIT 1) DESC NULLS LAST,
             n.is_default DESC, n.created_at, n.id
    LIMIT 1
) num ON true
LEFT JOIN LATERAL (
    SELECT v.id, v.number_id FROM conversations v
    WHERE v.project_id = c.project_id AND v.id = (
        SELECT o.id FROM conversations o
        WHERE o.project_id = c.project_id AND o.contact_id = c.id AND o.status <> 'resolved'
        ORDER BY o.id = %(conversation_id)s::uuid DESC NULLS LAST, o.created_at DESC, o.id
        LIMIT 1
    )
      AND v.status <> 'resolved'
    FOR UPDATE SKIP LOCKED
) th ON true
LEFT JOIN followup_instance_pacing pace ON pace.project_id = c.project_id AND pace.number_id = num.id
WHERE c.project_id = %(project_id)s AND c.id = %(contact_id)s
FOR SHARE OF c SKIP LOCKED
