-- name: insert_contact
-- Create a contact.
INSERT INTO contacts (project_id, phone, name, timezone, attributes, tags)
VALUES (%(project_id)s, %(phone)s, %(name)s, %(timezone)s, %(attributes)s, %(tags)s)
RETURNING id, phone, name, timezone, attributes, tags, opted_out_at, consent, created_at, updated_at

-- name: upsert_contact
-- Create the contact with this phone, or merge the given fields into it; returns (id, created).
INSERT INTO contacts (project_id, phone, name, timezone, attributes, tags)
VALUES (%(project_id)s, %(phone)s, %(name)s, %(timezone)s, %(attributes)s, %(tags)s)
ON CONFLICT ON CONSTRAINT contacts_project_phone_key DO UPDATE SET
    name = coalesce(EXCLUDED.name, contacts.name),
    timezone = coalesce(EXCLUDED.timezone, contacts.timezone),
    attributes = contacts.attributes || EXCLUDED.attributes,
    tags = ARRAY(SELECT DISTINCT t FROM unnest(contacts.tags || EXCLUDED.tags) AS t ORDER BY t),
    updated_at = now()
RETURNING id, (xmax = 0) AS created

-- name: get_contact
-- One contact of a project.
SELECT id, phone, name, timezone, attributes, tags, opted_out_at, consent, created_at, updated_at
FROM contacts
WHERE project_id = %(project_id)s AND id = %(id)s

-- name: list_contacts
-- A page of contacts in id order.
SELECT id, phone, name, timezone, attributes, tags, opted_out_at, consent, created_at, updated_at
FROM contacts
WHERE project_id = %(project_id)s
  AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(phone)s::text IS NULL OR phone = %(phone)s::text)
ORDER BY id
LIMIT %(limit)s

-- name: update_contact
-- Partial update: name, time zone, attributes merged (null removes a key).
UPDATE contacts SET
    name = CASE WHEN %(set_name)s THEN %(name)s::text ELSE name END,
    timezone = CASE WHEN %(set_timezone)s THEN %(timezone)s::text ELSE timezone END,
    attributes = CASE WHEN %(set_attributes)s
                      THEN (attributes - %(removed_attributes)s::text[]) || %(attributes)s::jsonb
                      ELSE attributes END,
    updated_at = now()
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id, phone, name, timezone, attributes, tags, opted_out_at, consent, created_at, updated_at

-- name: add_tags
-- Add tags to a contact.
UPDATE contacts SET
    tags = ARRAY(SELECT DISTINCT t FROM unnest(tags || %(tags)s::text[]) AS t ORDER BY t),
    updated_at = now()
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id, phone, name, timezone, attributes, tags, opted_out_at, consent, created_at, updated_at

-- name: remove_tags
-- Remove tags from a contact.
UPDATE contacts SET
    tags = ARRAY(SELECT t FROM unnest(tags) AS t WHERE t <> ALL (%(tags)s::text[]) ORDER BY t),
    updated_at = now()
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id, phone, name, timezone, attributes, tags, opted_out_at, consent, created_at, updated_at
