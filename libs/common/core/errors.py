"""Domain errors.

    FollowupsError
     ├── NotFound                 a resource does not exist in this project
     ├── InvalidInput             a field has a value the domain rejects (names the field)
     ├── Conflict                 the request contradicts stored state
     │    └── AlreadyExists       a unique natural key is taken
     ├── Unauthorized             missing or unknown API key
     ├── Forbidden                the caller may not do this (its API key's scope is too narrow)
     ├── Busy                     the project runs as many of these at once as it may: try again
     └── DatabaseUnavailable      PostgreSQL cannot be reached

Each subclass's docstring is its default message. Driver errors are mapped to these at the database
boundary (:func:`libs.common.db.map_errors`); transports map these to responses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager


class FollowupsError(Exception):
    """Something went wrong."""

    #: A stable machine-readable code for this kind of error (``None``: the HTTP status says enough).
    code: str | None = None

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        self.field = field
        #: Every ``(field, message)`` the error is about: its own, or each of a body checked whole
        #: (:meth:`InvalidInput.every`).
        self.errors: list[tuple[str, str]] = [(field, self.message)] if field else []
        super().__init__(self.message)


class NotFound(FollowupsError):
    """Not found."""


class InvalidInput(FollowupsError):
    """Invalid input."""

    @classmethod
    def every(cls, errors: Sequence[tuple[str, str]]) -> InvalidInput:
        """One error about several fields (a body checked whole): its message names each, its ``field``
        is the first one's."""
        if len(errors) == 1:
            return cls(errors[0][1], field=errors[0][0])
        exc = cls("; ".join(f"{field}: {message}" for field, message in errors), field=errors[0][0])
        exc.errors = list(errors)
        return exc


class Refusals:
    """Every error of a value checked whole: each check runs in :meth:`check` (its InvalidInput is kept,
    the next check runs), then :meth:`raise_any` raises them all as one (:meth:`InvalidInput.every`)."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except InvalidInput as exc:
            self.errors.extend(exc.errors or [("", exc.message)])

    def add(self, field: str, message: str) -> None:
        self.errors.append((field, message))

    def raise_any(self) -> None:
        if self.errors:
            raise InvalidInput.every(self.errors)


class Conflict(FollowupsError):
    """The request conflicts with the current state."""


class AlreadyExists(Conflict):
    """Already exists."""


class Unauthorized(FollowupsError):
    """A valid API key is required (Authorization: Bearer <key>)."""


class Forbidden(FollowupsError):
    """This API key's scope does not allow this request."""

    code = "missing_scope"


class Busy(FollowupsError):
    """The project runs as many of these at once as it may: try again in a moment."""

    code = "busy"


class DatabaseUnavailable(FollowupsError):
    """The database cannot be reached."""
