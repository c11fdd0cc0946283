-- name: insert_portfolio
-- A new portfolio of the project.
INSERT INTO portfolios (project_id, name, tier, created_at, updated_at)
VALUES (%(project_id)s, %(name)s, %(tier)s, %(now)s, %(now)s)
RETURNING id, name, tier, created_at, updated_at

-- name: get_portfolio
-- One portfolio of the project, with its numbers' ids.
SELECT p.id, p.name, p.tier, p.created_at, p.updated_at,
       ARRAY(SELECT n.id FROM numbers n WHERE n.project_id = p.project_id AND n.portfolio_id = p.id
             ORDER BY n.id) AS number_ids
FROM portfolios p
WHERE p.project_id = %(project_id)s AND p.id = %(id)s

-- name: list_portfolios
-- A page of the project's portfolios in id order, with their numbers' ids.
SELECT p.id, p.name, p.tier, p.created_at, p.updated_at,
       ARRAY(SELECT n.id FROM numbers n WHERE n.project_id = p.project_id AND n.portfolio_id = p.id
             ORDER BY n.id) AS number_ids
FROM portfolios p
WHERE p.project_id = %(project_id)s AND (%(after)s::uuid IS NULL OR p.id > %(after)s::uuid)
ORDER BY p.id
LIMIT %(limit)s

-- name: update_portfolio
-- A portfolio's new name or tier (absent: kept).
UPDATE portfolios SET name = coalesce(%(name)s, name), tier = coalesce(%(tier)s, tier), updated_at = %(now)s
WHERE project_id = %(project_id)s AND id = %(id)s
RETURNING id

-- name: set_tier_of_number
-- The tier of a number's portfolio (the provider's quality update names the number); its portfolio's id.
UPDATE portfolios p SET tier = %(tier)s, updated_at = %(now)s
FROM numbers n
WHERE n.project_id = %(project_id)s AND n.id = %(number_id)s
  AND p.project_id = n.project_id AND p.id = n.portfolio_id
RETURNING p.id

-- name: lock_for_opening
-- A portfolio locked for a new recipient's opening (the openings of one portfolio are counted one at a
-- time), its tier, how many numbers share it, and whether the contact is already a recipient of the last
-- 24 h.
SELECT p.tier,
       (SELECT count(*) FROM numbers n WHERE n.project_id = p.project_id AND n.portfolio_id = p.id) AS numbers,
       EXISTS (SELECT 1 FROM portfolio_recipients r
               WHERE r.project_id = p.project_id AND r.portfolio_id = p.id AND r.contact_id = %(contact_id)s
                 AND r.opened_at > %(now)s::timestamptz - interval '24 hours') AS known
FROM portfolios p
WHERE p.project_id = %(project_id)s AND p.id = %(portfolio_id)s
FOR NO KEY UPDATE

-- name: openings
-- The portfolio's openings of the last 24 h (an hour's bucket counts while any of it is inside the 24 h):
-- in all and the number's, and the first hour that counts for each (at most 25 rows a number).
SELECT coalesce(sum(opened), 0) AS total,
       coalesce(sum(opened) FILTER (WHERE number_id = %(number_id)s), 0) AS mine,
       min(hour) AS first_hour,
       min(hour) FILTER (WHERE number_id = %(number_id)s) AS my_first_hour
FROM portfolio_openings
WHERE project_id = %(project_id)s AND portfolio_id = %(portfolio_id)s
  AND hour > %(now)s::timestamptz - interval '25 hours'

-- name: record_opening
-- A new recipient's conversation opened: the recipient remembered, its hour's count up by one, and the
-- portfolio's buckets past counting dropped.
WITH recipient AS (
    INSERT INTO portfolio_recipients (project_id, portfolio_id, contact_id, opened_at)
    VALUES (%(project_id)s, %(portfolio_id)s, %(contact_id)s, %(now)s)
    ON CONFLICT (project_id, portfolio_id, contact_id) DO UPDATE SET opened_at = EXCLUDED.opened_at
), dropped AS (
    DELETE FROM portfolio_openings
    WHERE project_id = %(project_id)s AND portfolio_id = %(portfolio_id)s
      AND hour <= %(now)s::timestamptz - interval '25 hours'
)
INSERT INTO portfolio_openings (project_id, portfolio_id, hour, number_id, opened)
VALUES (%(project_id)s, %(portfolio_id)s, date_trunc('hour', %(now)s), %(number_id)s, 1)
ON CONFLICT (project_id, portfolio_id, hour, number_id) DO UPDATE SET opened = portfolio_openings.opened + 1
