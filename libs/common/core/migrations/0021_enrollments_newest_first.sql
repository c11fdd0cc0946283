-- Enrollment lists (GET /v1/enrollments, the dashboard's list and contact card) page newest first within a
-- project: the index walks a project's enrollments in that order, the page's cursor seeks in it.
CREATE INDEX followup_enrollments_project_enrolled_idx
    ON followup_enrollments (project_id, enrolled_at DESC, id DESC);
