-- Running counts of messages for the sending constraints, kept by a trigger so that reading one is O(1)
-- whatever the size of the queue: follow-ups QUEUED or PROCESSING on a number (the in-flight window) and
-- messages QUEUED in a project (the send-lane backlog). A count is spread over 16 shards (a message always
-- lands on the shard its id hashes to) so that concurrent writers seldom meet on a row; its value is the
-- sum of its shards. Each statement on messages adds its deltas per row of this table at once, in key
-- order, so that two writers always lock counter rows in the same order and never deadlock.

CREATE TABLE message_counters (
    kind      text     NOT NULL CHECK (kind IN ('number_in_flight', 'project_queued')),
    owner_id  uuid     NOT NULL,  -- the number (number_in_flight) or the project (project_queued)
    shard     smallint NOT NULL,
    messages  bigint   NOT NULL,
    PRIMARY KEY (kind, owner_id, shard)
);

CREATE FUNCTION message_counter_deltas(changed messages, sign integer)
RETURNS TABLE (kind text, owner_id uuid, shard smallint, delta integer)
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'number_in_flight', changed.number_id, (hashtext(changed.id::text) & 15)::smallint, sign
    WHERE changed.status IN ('QUEUED', 'PROCESSING') AND changed.source = 'followup'
      AND changed.number_id IS NOT NULL
    UNION ALL
    SELECT 'project_queued', changed.project_id, (hashtext(changed.id::text) & 15)::smallint, sign
    WHERE changed.status = 'QUEUED'
$$;

CREATE FUNCTION count_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO message_counters AS mc (kind, owner_id, shard, messages)
        SELECT d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM new_rows n, message_counter_deltas(n, 1) d
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO message_counters AS mc (kind, owner_id, shard, messages)
        SELECT d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM (SELECT d.* FROM new_rows n, message_counter_deltas(n, 1) d
              UNION ALL
              SELECT d.* FROM old_rows o, message_counter_deltas(o, -1) d) d
        GROUP BY 1, 2, 3 HAVING sum(d.delta) <> 0 ORDER BY 1, 2, 3
        ON CONFLICT (kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    ELSE
        INSERT INTO message_counters AS mc (kind, owner_id, shard, messages)
        SELECT d.kind, d.owner_id, d.shard, sum(d.delta)
        FROM old_rows o, message_counter_deltas(o, -1) d
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (kind, owner_id, shard) DO UPDATE SET messages = mc.messages + excluded.messages;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_counted_on_insert AFTER INSERT ON messages
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_messages();
CREATE TRIGGER messages_counted_on_update AFTER UPDATE ON messages
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_messages();
CREATE TRIGGER messages_counted_on_delete AFTER DELETE ON messages
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION count_messages();

-- the messages already there
INSERT INTO message_counters (kind, owner_id, shard, messages)
SELECT d.kind, d.owner_id, d.shard, sum(d.delta)
FROM messages m, message_counter_deltas(m, 1) d
GROUP BY 1, 2, 3;

-- the counters replace the count over this index
DROP INDEX messages_in_flight_number_idx;
