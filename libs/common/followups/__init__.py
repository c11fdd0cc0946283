"""Follow-up sequences (seed 000): definitions and templates, sequences and their immutable versions,
``enroll()``, the conversation shortcut, the stop paths, the release step, statistics and erasure.

    definition     step kinds, timing, stop flags; validation; when a step is due
    sequences      drafts, versions (and the per-process version cache)
    enrollments    enroll(), reads, pause / resume / stop / reschedule by hand
    transitions    every change to an enrollment after it was created (the one writer of that table)
    stops          the stop paths of platform events
    release_step   one step, one transaction (the release service claims; the AI step's second pass too)
    campaigns      a campaign's no-reply sequence, and its released recipients' enrollment

Owns: ``followup_sequences``, ``followup_sequence_versions``, ``followup_enrollments``,
``followup_step_runs``, ``followup_campaigns``,
``followup_instance_pacing``, ``followup_settings``.
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
    }
)
