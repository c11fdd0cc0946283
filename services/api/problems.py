"""Every error as a problem-details body (RFC 9457) naming the offending field.

Field paths are dotted, list indexes included: ``definition.steps.0.kind``, ``tags.0``. Input that does
not decode is 400 when its *shape* is wrong (malformed JSON, an unknown or missing field, a wrong type)
and 422 when a well-typed *value* is refused (an unknown step kind, a value outside an enum, a number or
length outside its bounds), the same status the domain gives the values it rejects. A body larger than its
route takes is 413 naming ``body``. A domain error with a stable ``code`` (``already_enrolled``,
``plan_limit``, ...) carries it as the ``code`` member.

A body with several problems answers every one (``errors`` lists each field with its message, in plain
words naming the allowed values or bounds: :mod:`libs.common.core.decoding`); ``detail`` joins them. A body
that does not decode is answered with what the checks after decoding refuse in the rest of it too
(:mod:`services.api.body_checks`): each such error is about a value, so it alone never makes the answer a
400, and a shape error beside it still does.

Bodies are decoded strictly (no number for a time, no string for a number: :mod:`services.api.body`); a
body refused there is reported here, after authentication, like any other parameter.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.types import ExceptionHandlersMap

from libs.common.core.errors import (
    Busy,
    Conflict,
    DatabaseUnavailable,
    FollowupsError,
    Forbidden,
    InvalidInput,
    NotFound,
    Unauthorized,
)
from services.api.body import held_refusal

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"

#: A 503's ``Retry-After``: an outage of the database is noticed within ~2 s, and a retry a second later
#: finds it either still down (answered as fast) or back.
RETRY_AFTER_SECONDS = 1

#: Domain error -> HTTP status, for REST and the dashboard alike (:func:`status_of`); a domain error of no
#: kind listed here is 400.
STATUS_OF: dict[type[FollowupsError], int] = {
    NotFound: 404,
    InvalidInput: 422,
    Conflict: 409,
    Unauthorized: 401,
    Forbidden: 403,
    Busy: 429,
    DatabaseUnavailable: 503,
}

#: Each status's title: a problem's ``title``, an error page's heading (:func:`title_of`).
TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    408: "Request timeout",
    409: "Conflict",
    413: "Content too large",
    422: "Invalid input",
    429: "Too many requests",
    500: "Internal error",
    503: "Unavailable",
}

#: Headers a status always carries: the scheme to authenticate with, when to try again.
_HEADERS = {
    401: {"WWW-Authenticate": "Bearer"},
    429: {"Retry-After": str(RETRY_AFTER_SECONDS)},
    503: {"Retry-After": str(RETRY_AFTER_SECONDS)},
}

_NAMED_FIELD = re.compile(r"(?:unknown|missing required) field `([^`]+)`")
_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`")
#: msgspec messages about a value of the right type that a constraint refuses: an unknown tag
#: ("Invalid value 'sms'"), a Literal / enum ("Invalid enum value 'x'"), bounds, lengths, patterns, zones.
_VALUE_ERROR = re.compile(
    r"^(?:Invalid (?:enum )?value\b"
    r"|Expected `[^`]+` (?:>=|<=|>|<|that's a multiple of|of length|matching regex|with (?:a|no) timezone))"
)


def status_of(exc: FollowupsError) -> int:
    """The HTTP status a domain error is answered with (see :data:`STATUS_OF`)."""
    return next((code for kind, code in STATUS_OF.items() if isinstance(exc, kind)), 400)


def title_of(status: int) -> str:
    """The title of an answer with ``status`` (``Error`` for a status without one of its own)."""
    return TITLES.get(status, "Error")


def problem(
    status: int,
    detail: str,
    *,
    errors: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    code: str | None = None,
) -> Response[Any]:
    body = problem_body(status, detail, errors=errors, code=code)
    return Response(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def problem_body(
    status: int, detail: str, *, errors: list[dict[str, str]] | None = None, code: str | None = None
) -> dict[str, Any]:
    """A problem's JSON body (for an answer written below Litestar, as the server's 408)."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title_of(status),
        "status": status,
        "detail": detail,
    }
    if code is not None:
        body["code"] = code
    if errors:
        body["errors"] = errors
    return body


def _field_of(message: str, key: str | None, source: str | None = None) -> str:
    """The field a msgspec/Litestar validation message is about, as a dotted path.

    Litestar keys an error about the request body itself (not one of its fields) as ``data``.
    """
    named = _NAMED_FIELD.search(message)
    at = _AT_PATH.search(message)
    path = at.group(1) if at else ("" if source == "body" and key == "data" else (key or ""))
    path = re.sub(r"\[(\d+)\]", r".\1", path).strip(".")
    if named:
        return f"{path}.{named.group(1)}" if path else named.group(1)
    return path or "body"


def _domain_error(request: Request[Any, Any, Any], exc: FollowupsError) -> Response[Any]:
    status = status_of(exc)
    errors = [{"field": field, "message": message} for field, message in exc.errors if field] or None
    headers = _HEADERS.get(status)
    return problem(status, exc.message, errors=errors, headers=headers, code=exc.code)


def _validation_error(request: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    items = exc.extra if isinstance(exc.extra, list) else []
    if (refusal := held_refusal(request)) is not None and isinstance(refusal.extra, list):
        # the body did not decode (services.api.body): its own refusal, not "got a RefusedBody"
        items = [item for item in items if item.get("source") != "body"] + refusal.extra
    errors, about_values = [], []
    for item in items:
        message = str(item.get("message", ""))
        field = item.get("field") or _field_of(message, item.get("key"), item.get("source"))
        errors.append({"field": field, "message": item.get("plain") or _AT_PATH.sub("", message)})
        # a check after decoding refuses a value (services.api.body_checks), as the domain does
        about_values.append(bool(item.get("checked")) or bool(_VALUE_ERROR.match(_AT_PATH.sub("", message))))
    if not errors and exc.detail:
        errors.append({"field": _field_of(exc.detail, None), "message": _AT_PATH.sub("", exc.detail)})
        about_values.append(bool(_VALUE_ERROR.match(errors[-1]["message"])))
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "The request is not valid."
    # 422 only when every error is about a value; any shape error makes the request a bad request
    status = 422 if about_values and all(about_values) else 400
    return problem(status, detail, errors=errors)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    return problem(exc.status_code, exc.detail, headers=exc.headers)


def _too_large(request: Request[Any, Any, Any], exc: RequestEntityTooLarge) -> Response[Any]:
    limit = request.route_handler.resolve_request_max_body_size()
    message = (
        f"the request body is larger than the {limit} bytes this endpoint takes"
        if limit
        else "the request body is too large"
    )
    return problem(413, message, errors=[{"field": "body", "message": message}])


def _too_deep(request: Request[Any, Any, Any], exc: RecursionError) -> Response[Any]:
    """msgspec (and json) refuse a body nested deeper than Python's recursion limit with RecursionError."""
    log.warning("request too deeply nested", extra={"path": request.url.path, "method": request.method})
    message = "the request body is nested too deeply"
    return problem(400, message, errors=[{"field": "body", "message": message}])


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error", extra={"path": request.url.path, "method": request.method})
    return problem(500, "An unexpected error occurred; it has been logged.")


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    FollowupsError: _domain_error,
    ValidationException: _validation_error,
    RequestEntityTooLarge: _too_large,
    HTTPException: _http_error,
    RecursionError: _too_deep,
    Exception: _unexpected,
}
