"""Infrastructure every context stands on: the clock, database access and named SQL, domain errors,
settings, logs, metrics, input validation, polling loops, the process runtime, cron schedules, the broker,
schema migrations and the transactional outbox.

Owns: ``schema_migrations``, ``outbox``. May import: ``contracts`` (nothing else of ``libs.common``).
"""
