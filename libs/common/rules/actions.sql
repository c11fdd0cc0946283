-- name: message_recipient
-- What a rule's message needs of its contact: the template fields, opt-out and consent, and when the
-- contact last wrote (the WhatsApp service window).
SELECT c.name, c.phone, c.attributes, c.timezone, p.timezone AS project_timezone,
       c.opted_out_at IS NOT NULL AS opted_out, c.consent, c.erased_at IS NOT NULL AS erased, c.last_inbound_at
FROM contacts c
JOIN projects p ON p.id = c.project_id
WHERE c.project_id = %(project_id)s AND c.id = %(contact_id)s
