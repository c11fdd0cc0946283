-- A sequence's preview (POST /v1/sequences/{id}/preview) runs the release step on an enrollment it rolls
-- back. It must not lock a row that a real enrollment, release or send waits for: the counters. Its
-- savepoint sets followups.preview (set_config, local: it ends with the savepoint), and what counts
-- skips it: the message counters' trigger here; the live-enrollment and usage counters and the plan lock in
-- their statements (enrollments.sql, transitions.sql, messages.sql).
CREATE OR REPLACE FUNCTION count_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('followups.preview', true) = 'on' THEN
        RETURN NULL;  -- a preview: rolled back, and it must hold no counter row a real send waits for
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO message_counters AS mc (project_id, kind, owner_id, shard, messages)
        SELECT d.project_id, d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM new_rows n, message_counter_deltas(n, 1) d
        GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (project_id, kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO message_counters AS mc (project_id, kind, owner_id, shard, messages)
        SELECT d.project_id, d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM (SELECT d.* FROM new_rows n, message_counter_deltas(n, 1) d
              UNION ALL
              SELECT d.* FROM old_rows o, message_counter_deltas(o, -1) d) d
        GROUP BY 1, 2, 3, 4 HAVING sum(d.delta) <> 0 ORDER BY 1, 2, 3, 4
        ON CONFLICT (project_id, kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    ELSE
        INSERT INTO message_counters AS mc (project_id, kind, owner_id, shard, messages)
        SELECT d.project_id, d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM old_rows o, message_counter_deltas(o, -1) d
        GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (project_id, kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    END IF;
    RETURN NULL;
END
$$;

