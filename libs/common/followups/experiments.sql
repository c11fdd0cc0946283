-- name: upsert_winner
-- Record the winner of a sequence's experiment and the version it was published in (the release reads it:
-- an enrollment on an older version that reaches the split takes it too). The same variant again keeps when
-- it was chosen.
INSERT INTO followup_experiment_winners AS w (project_id, sequence_id, experiment, variant, version_id, chosen_at)
VALUES (%(project_id)s, %(sequence_id)s, %(experiment)s, %(variant)s, %(version_id)s, %(now)s)
ON CONFLICT (project_id, sequence_id, experiment) DO UPDATE
SET variant = EXCLUDED.variant,
    version_id = EXCLUDED.version_id,
    chosen_at = CASE WHEN w.variant = EXCLUDED.variant THEN w.chosen_at ELSE EXCLUDED.chosen_at END
RETURNING variant, version_id, chosen_at
