"""Domain errors.

    FollowupsError
     ├── NotFound                 a resource does not exist in this project
     ├── InvalidInput             a field has a value the domain rejects (names the field)
     ├── Conflict                 the request contradicts stored state
     │    └── AlreadyExists       a unique natural key is taken
     ├── Unauthorized             missing or unknown API key
     ├── Forbidden                the caller may not do this (its API key's scope is too narrow)
     └── DatabaseUnavailable      PostgreSQL cannot be reached

Each subclass's docstring is its default message. Driver errors are mapped to these at the database
boundary (:func:`libs.common.db.map_errors`); transports map these to responses.
"""

from __future__ import annotations


class FollowupsError(Exception):
    """Something went wrong."""

    #: A stable machine-readable code for this kind of error (``None``: the HTTP status says enough).
    code: str | None = None

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        self.field = field
        super().__init__(self.message)


class NotFound(FollowupsError):
    """Not found."""


class InvalidInput(FollowupsError):
    """Invalid input."""


class Conflict(FollowupsError):
    """The request conflicts with the current state."""


class AlreadyExists(Conflict):
    """Already exists."""


class Unauthorized(FollowupsError):
    """A valid API key is required (Authorization: Bearer <key>)."""


class Forbidden(FollowupsError):
    """This API key's scope does not allow this request."""

    code = "missing_scope"


class DatabaseUnavailable(FollowupsError):
    """The database cannot be reached."""
