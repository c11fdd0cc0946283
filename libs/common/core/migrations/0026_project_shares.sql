-- A claim in turns across projects reads, without locks, the projects with pending work in turn and the
-- share of a batch each may take (libs/common/core/jobs.py's claim_in_turns); then each project's claim is
-- a statement of its own. The shares are one function for every queue: the projects in turn
-- (projects_in_turn over the queue's project-led index, where `pending` holds), each one's ready items
-- (where `ready` holds too; `ready` may name $1, the time now, and $2, a filter value) counted from the same
-- index up to four times an even share, and the batch water-filled over those counts (fair_share).
CREATE FUNCTION project_shares(queue regclass, pending text, ready text, after uuid, most integer,
                               batch integer, now timestamptz, filter uuid DEFAULT NULL)
RETURNS TABLE (project_id uuid, share integer)
LANGUAGE plpgsql STABLE ROWS 20
AS $$
BEGIN
    RETURN QUERY EXECUTE format($shares$
        WITH walked AS (
            SELECT w.project_id, w.turn FROM projects_in_turn(%1$L::regclass, %2$L, $3, $4) w
        ), counted AS (
            SELECT w.project_id,
                   (SELECT count(*) FROM (
                        SELECT 1 FROM %1$s q
                        WHERE q.project_id = w.project_id AND %2$s AND %3$s
                        LIMIT (SELECT least($5, ceil(4.0 * $5 / count(*))) FROM walked)) x) AS due
            FROM walked w
        ), shared AS (
            SELECT fair_share($5, array_agg(due ORDER BY due)) AS n FROM counted
        )
        SELECT w.project_id, s.n FROM walked w CROSS JOIN shared s ORDER BY w.turn
    $shares$, queue, pending, ready) USING now, filter, after, most, batch;
END
$$;
