"""The composition root: the ``followups`` command builds a runtime and runs services in it.

This is the one package allowed to import several services (see the import-linter contracts).
"""
