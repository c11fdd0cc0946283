-- The rules' queues are claimed in turns across projects (libs/common/core/jobs.py's RoundRobin): a claim
-- walks the projects with pending work (a skip scan of the project-led index, one descent per project) and
-- takes each one's oldest due items from the same index, so one project's backlog is never read to reach
-- another's single item. The project-led index replaces the one led by time.
CREATE INDEX followup_triggers_project_pending_idx ON followup_triggers (project_id, next_attempt_at, id)
    WHERE processed_at IS NULL;
DROP INDEX followup_triggers_pending_idx;

-- An execution is claimable from the later of its due time and its lease's end (a backoff is a lease): the
-- index orders each project's pending executions by that, so a project's executions backed off after a
-- failure are not read to reach its due ones, nor another project's.
CREATE INDEX rule_pending_executions_project_ready_idx
    ON rule_pending_executions (project_id, (greatest(due_at, coalesce(locked_until, due_at))), id)
    WHERE status = 'pending';

-- A project's share of a fair claim's batch of `batch` items among projects with `due` items each (sorted
-- ascending): the most items each may take so that together they take at most the batch (water-filling:
-- what the projects with less than an even share leave goes to the others), at least one.
CREATE FUNCTION fair_share(batch integer, due bigint[]) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (
    WITH ranked AS (
        SELECT d, k, sum(d) OVER (ORDER BY k) AS below, cardinality(due) AS n
        FROM unnest(due) WITH ORDINALITY AS u(d, k)
    ), served AS (  -- the smallest ones, while all of them and an equal part for each of the rest fit
        SELECT coalesce(max(k), 0) AS k, coalesce(max(below), 0) AS below, max(n) AS n
        FROM ranked WHERE below + (n - k) * d <= batch
    )
    SELECT CASE WHEN cardinality(due) IS NULL OR k >= cardinality(due) THEN batch
                ELSE greatest(1, floor((batch - below) / (cardinality(due) - k)))::integer END
    FROM served
);

-- The projects with pending work in `queue` (the rows where `pending` holds: the predicate of the queue's
-- project-led partial index), in turns: those after `after` in id order, then from the first up to `after`
-- (wrapping around), at most `most` of them. A skip scan: one index descent per project, whatever each
-- one's backlog.
CREATE FUNCTION projects_in_turn(queue regclass, pending text, after uuid, most integer)
RETURNS TABLE (project_id uuid, turn integer)
LANGUAGE plpgsql STABLE ROWS 20
AS $$
BEGIN
    RETURN QUERY EXECUTE format($walk$
        WITH RECURSIVE after_cursor(project_id, turn) AS (
            SELECT (SELECT q.project_id FROM %1$s q WHERE %2$s AND q.project_id > $1
                    ORDER BY q.project_id LIMIT 1), 1
            UNION ALL
            SELECT (SELECT q.project_id FROM %1$s q WHERE %2$s AND q.project_id > w.project_id
                    ORDER BY q.project_id LIMIT 1), w.turn + 1
            FROM after_cursor w WHERE w.project_id IS NOT NULL AND w.turn < $2
        ), wrapped(project_id, turn) AS (
            SELECT (SELECT q.project_id FROM %1$s q WHERE %2$s AND q.project_id <= $1
                    ORDER BY q.project_id LIMIT 1), $2 + 1
            UNION ALL
            SELECT (SELECT q.project_id FROM %1$s q WHERE %2$s AND q.project_id > w.project_id
                        AND q.project_id <= $1
                    ORDER BY q.project_id LIMIT 1), w.turn + 1
            FROM wrapped w WHERE w.project_id IS NOT NULL AND w.turn < 2 * $2
        )
        SELECT w.project_id, w.turn::integer
        FROM (SELECT * FROM after_cursor UNION ALL SELECT * FROM wrapped) w
        WHERE w.project_id IS NOT NULL
        ORDER BY w.turn
        LIMIT $2
    $walk$, queue, pending) USING after, most;
END
$$;
