"""The domain library: every rule of the specification that is not transport, one package per bounded
context, layered (import-linter checks it; a context imports only those below it):

    ingress                       one platform event: the platform change, then stop paths (then rules)
    followups                     sequences, enrollments, stop paths, the release step
    platform                      projects, contacts, conversations, messages, send lane, leads and deals
    core                          clock, database, SQL, settings, logs, metrics, loops, broker, outbox
    contracts                     actor payloads, event structs, platform events (importable everywhere)

Services (``services.*``) import this package; it imports no service.
"""
