-- The release claims a project at a time: each claim is one project's oldest due enrollment (a statement
-- with an equality on project_id, routed to one shard on Citus), and the release loop walks the projects
-- with active enrollments in turns (one descent of this index to find each next project, one to see
-- whether its earliest enrollment is due), so one project's backlog is never read to reach another's.
-- The index led by time goes: a claim of one project could be planned on it, reading every other
-- project's due rows first (a generic plan estimates a project's share as one over the number of projects).
CREATE INDEX followup_enrollments_project_claim_idx ON followup_enrollments (project_id, next_run_at)
    WHERE status = 'active';
DROP INDEX followup_enrollments_claim_idx;
