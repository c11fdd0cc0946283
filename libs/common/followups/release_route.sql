-- name: experiment_winner
-- The winner chosen for a sequence's experiment, if one was (a split step's release reads it: one indexed
-- read, only at a split).
SELECT variant FROM followup_experiment_winners
WHERE project_id = %(project_id)s AND sequence_id = %(sequence_id)s AND experiment = %(experiment)s
