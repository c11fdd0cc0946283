"""AI steps: the prompt, the OpenAI-compatible model client, and the step's model call between the release
service's first pass (a lease and a fence) and the second pass (every check again, under the lock).

Owns ``ai_budget_ledger``. May import: followups, platform, core and contracts.
"""
