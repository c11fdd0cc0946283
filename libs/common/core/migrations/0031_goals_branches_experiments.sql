-- Sequences that convert, branch and learn (docs/api.md, "Goals, exits, branches and experiments").
--
-- An enrollment may now end converted (a goal met: its name in goal) or exited (an exit criterion met: its
-- name in exited_by), mid-delay, in the event's own transaction. A finished enrollment converts late inside
-- its sequence's conversion window: converted_at and goal are set once, its status kept.
ALTER TABLE followup_enrollments DROP CONSTRAINT followup_enrollments_status_check;
ALTER TABLE followup_enrollments ADD CONSTRAINT followup_enrollments_status_check
    CHECK (status IN ('active', 'paused', 'completed', 'stopped', 'failed', 'converted', 'exited'));
ALTER TABLE followup_enrollments
    -- the goal met (converted, or a late conversion of a finished enrollment), when, and the step it is
    -- attributed to (the last step whose message was sent)
    ADD COLUMN goal text,
    ADD COLUMN converted_at timestamptz,
    ADD COLUMN converted_step integer,
    -- the exit criterion that ended it (exited)
    ADD COLUMN exited_by text,
    -- while it waits for a reply at a wait_for_reply step with a reply path: the step a reply moves it to
    -- (-1: the reply path ends the enrollment, completed); null otherwise (a reply stops it, as before)
    ADD COLUMN reply_step integer,
    -- when it took a reply path: replies before this no longer stop it
    ADD COLUMN reply_taken_at timestamptz,
    -- the variant of each experiment (split step) it was assigned: {"experiment": "variant" | "holdout"}
    ADD COLUMN assignments jsonb;

-- A branch, a wait for a reply or a split step routes the enrollment without sending: its step run is
-- 'branched', its reason the path taken (path:<name>, variant:<name>, holdout, replied, no_reply).
ALTER TABLE followup_step_runs DROP CONSTRAINT followup_step_runs_outcome_check;
ALTER TABLE followup_step_runs ADD CONSTRAINT followup_step_runs_outcome_check
    CHECK (outcome IN ('queued', 'skipped', 'branched'));

-- A winner chosen for a sequence's experiment: every enrollment that reaches the split from then on, on
-- whichever version, takes that variant (the new version it was published in names it too).
CREATE TABLE followup_experiment_winners (
    project_id uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    sequence_id uuid NOT NULL,
    experiment text NOT NULL,
    variant text NOT NULL,
    version_id uuid NOT NULL,
    chosen_at timestamptz NOT NULL,
    PRIMARY KEY (project_id, sequence_id, experiment),
    FOREIGN KEY (project_id, sequence_id) REFERENCES followup_sequences (project_id, id) ON DELETE CASCADE
);
