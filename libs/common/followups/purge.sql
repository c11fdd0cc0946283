-- What the follow-ups context deletes once its time is up (the retention job calls it, a batch at a time).
-- The batch is picked through an index (the inner select) and deleted by primary key: ``id = ANY(ARRAY(...))``
-- makes the batch a list the outer DELETE looks up, not a join that reads the whole table.

-- name: finished_enrollments
-- Finished enrollments older than their project's retention_days (default 90), oldest first; their step
-- runs go with them (the messages stay: they keep the enrollment's id without a foreign key).
DELETE FROM followup_enrollments
WHERE id = ANY(ARRAY(
    SELECT e.id FROM followup_enrollments e
    LEFT JOIN followup_settings s ON s.project_id = e.project_id
    WHERE e.status IN ('completed', 'stopped', 'failed')
      AND e.finished_at < %(now)s::timestamptz - interval '1 day'
      AND e.finished_at < %(now)s::timestamptz - make_interval(days => coalesce(s.retention_days, 90))
    ORDER BY e.finished_at
    LIMIT %(limit)s
))
