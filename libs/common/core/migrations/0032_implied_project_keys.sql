-- The two hottest inserts, an enrollment (500 a bulk chunk) and a rule's run (one per rule a trigger runs),
-- each checked a foreign key to projects that another of their keys already implies: an enrollment's
-- contact (project_id, contact_id) is the project's (contacts -> projects), and a run's rule
-- (project_id, rule_id) is the project's (rules -> projects). Deleting a project still deletes them, through
-- those keys (ON DELETE CASCADE all the way); each insert checks one key fewer.
ALTER TABLE followup_enrollments DROP CONSTRAINT followup_enrollments_project_id_fkey;
ALTER TABLE rule_runs DROP CONSTRAINT rule_runs_project_id_fkey;
