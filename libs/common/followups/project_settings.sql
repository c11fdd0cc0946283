-- name: get_settings
-- A project's follow-up settings (no settings row: the defaults) and its time zone.
SELECT s.project_id IS NOT NULL AS has_settings, p.timezone,
       s.send_window, s.consent_mode, s.service_window, s.max_per_contact_24h, s.send_delay_ms,
       s.max_in_flight_per_number, s.monthly_message_quota, s.max_send_lane_backlog, s.retention_days,
       s.business_hours, s.ai_monthly_token_budget, s.min_recipient_gap_seconds, s.max_per_contact_day,
       s.message_prices
FROM projects p
LEFT JOIN followup_settings s ON s.project_id = %(project_id)s
WHERE p.id = %(project_id)s

-- name: put_settings
-- Replace a project's follow-up settings.
INSERT INTO followup_settings (project_id, send_window, consent_mode, service_window, max_per_contact_24h,
                               send_delay_ms, max_in_flight_per_number, monthly_message_quota,
                               max_send_lane_backlog, retention_days, business_hours, ai_monthly_token_budget,
                               min_recipient_gap_seconds, max_per_contact_day, message_prices, updated_at)
VALUES (%(project_id)s, %(send_window)s, %(consent_mode)s, %(service_window)s, %(max_per_contact_24h)s,
        %(send_delay_ms)s, %(max_in_flight_per_number)s, %(monthly_message_quota)s, %(max_send_lane_backlog)s,
        %(retention_days)s, %(business_hours)s, %(ai_monthly_token_budget)s, %(min_recipient_gap_seconds)s,
        %(max_per_contact_day)s, %(message_prices)s, %(now)s)
ON CONFLICT (project_id) DO UPDATE SET
    send_window = EXCLUDED.send_window, consent_mode = EXCLUDED.consent_mode,
    service_window = EXCLUDED.service_window, max_per_contact_24h = EXCLUDED.max_per_contact_24h,
    send_delay_ms = EXCLUDED.send_delay_ms, max_in_flight_per_number = EXCLUDED.max_in_flight_per_number,
    monthly_message_quota = EXCLUDED.monthly_message_quota, max_send_lane_backlog = EXCLUDED.max_send_lane_backlog,
    retention_days = EXCLUDED.retention_days, business_hours = EXCLUDED.business_hours,
    ai_monthly_token_budget = EXCLUDED.ai_monthly_token_budget,
    min_recipient_gap_seconds = EXCLUDED.min_recipient_gap_seconds,
    max_per_contact_day = EXCLUDED.max_per_contact_day, message_prices = EXCLUDED.message_prices,
    updated_at = EXCLUDED.updated_at
