"""Follow-up sequences (seed 000): definitions and templates, sequences and their immutable versions,
``enroll()``, the conversation shortcut, the stop paths, the release step, the preview, statistics and
erasure.

    definition     step kinds (message, ai; branch, wait_for_reply, split), timing, stop flags, goals and
                   exits; validation; when a step is due
    graph          where an enrollment goes after a step: a step's next, a branch's paths, a wait's reply
                   and timeout paths, a split's variant (assigned per contact and experiment)
    sequences      drafts, versions (and the per-process version cache)
    experiments    choosing an experiment's winner: a new version naming it, recorded for the release
    statistics     a sequence's numbers: per status, step, path, experiment's variant and goal
    enrollments    enroll(), reads, pause / resume / stop / reschedule by hand
    transitions    every change to an enrollment after it was created, and its purge (the one writer)
    stops          the stop paths of platform events
    goals          goals and exits met by a platform event (converted, exited, a late conversion), and the
                   exits that block entry
    release        the release of one due enrollment: claim, step, commit, count (the release loop's work)
    release_claim  the claim of the oldest due enrollment, the next due time, the leased AI step's reads
    release_step   one step, one transaction (for a claimed enrollment; the AI step's second pass too)
    release_ai     the AI step's second pass: locked again under its fence, released with the draft
    campaigns      a campaign's no-reply sequence, and its released recipients' enrollment
    preview        a sequence's time-travel preview for a contact: enroll() and the release step run in a
                   savepoint that is rolled back

Owns: ``followup_sequences``, ``followup_sequence_versions``, ``followup_enrollments``,
``followup_step_runs``, ``followup_campaigns``,
``followup_instance_pacing``, ``followup_settings``, ``followup_live_counters`` (a project's live
enrollments, kept by the two statements that change how many are live), ``followup_experiment_winners``
(the winner chosen for an experiment).
May import: ``platform``, ``core``, ``contracts``.
"""

from __future__ import annotations

from typing import Final

#: The tables this context owns: it alone writes them (``tests/test_table_ownership.py`` checks it).
OWNS: Final = frozenset(
    {
        "followup_sequences",
        "followup_sequence_versions",
        "followup_enrollments",
        "followup_step_runs",
        "followup_campaigns",
        "followup_instance_pacing",
        "followup_settings",
        "followup_live_counters",
        "followup_experiment_winners",
    }
)
