"""The domain library: every rule of the specification that is not transport.

Services (``services.*``) import this package; it imports no service.
"""
