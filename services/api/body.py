"""Request bodies: at most :data:`MAX_BODY_BYTES` (413 beyond), decoded strictly into the handler's type.

Litestar decodes a JSON body to Python values and then converts them to the handler's ``data`` type with
``msgspec.convert(..., strict=False)`` (its signature model: the same call turns query and path strings
into ints and UUIDs). Lax conversion would take ``"60"`` for an int and ``5`` for a datetime (seconds
since 1970), so :class:`StrictRequest` decodes the body straight into the handler's type with
``strict=True``; the signature model then passes the decoded struct through untouched, and query and path
parameters keep their string conversion.

A body that does not decode is refused with every field it has wrong, each in plain words
(:mod:`libs.common.core.decoding`), not only the first msgspec met; and with what the checks after
decoding refuse in the rest of it (:mod:`services.api.body_checks`), so one answer names every error.

A body that does not decode is not refused at once: authentication comes first (an unknown caller learns
nothing about the body), as for every other parameter. The refusal is held on the request and ``data``
gets a value no type accepts, so the handler's parameters fail once its dependencies resolved;
:mod:`services.api.problems` then reports the held refusal, naming the field.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ValidationException
from litestar.handlers import HTTPRouteHandler

from libs.common.core import decoding
from services.api.body_checks import check_body
from services.api.deps import runtime_of

#: Largest request body (bytes) a route takes unless it says otherwise: a sequence of 50 steps of 4,096
#: characters each is ~200 KB (~1 MB written in 4-byte characters), far below it.
MAX_BODY_BYTES = 2 * 1024 * 1024

#: Largest body of a bulk enrollment: 100,000 contact ids (36 characters, quoted, comma) or phone numbers.
MAX_BULK_BODY_BYTES = 8 * 1024 * 1024

#: Where a body's held refusal waits in the request's scope state for the error handler.
_HELD = "followups.refused_body"


class RefusedBody:
    """What the handler's ``data`` parameter receives for a body that did not decode: no type accepts it,
    so the parameters fail (after authentication) and the held refusal is reported."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<refused body>"


REFUSED = RefusedBody()


def body_type(handler: HTTPRouteHandler) -> Any | None:
    """The type of the handler's JSON ``data`` parameter, or None when it takes no body."""
    field = handler.parsed_fn_signature.parameters.get("data")
    return None if field is None else field.annotation


class StrictRequest(Request[Any, Any, Any]):
    """A request whose JSON body is decoded strictly into the handler's ``data`` type (see the module)."""

    async def json(self) -> Any:
        target = body_type(self.route_handler)
        if target is None or target is Any:  # no type to hold a refusal against: Litestar's own decoding
            return await super().json()
        body = await self.body()
        extra: list[dict[str, str]] = []
        try:
            return msgspec.json.decode(body or b"null", type=target, strict=True)
        except msgspec.ValidationError as exc:  # a wrong type, an unknown or missing field, a bound
            refusal = str(exc)
            extra = self._every_refusal(body, target, exc)
        except msgspec.DecodeError as exc:  # not JSON at all
            refusal = f"the body is not valid JSON: {exc}"
        except RecursionError:  # nested deeper than Python's recursion limit
            refusal = "the request body is nested too deeply"
        self.scope.setdefault("state", {})[_HELD] = ValidationException(
            detail=refusal, extra=extra or [{"message": refusal, "key": "data", "source": "body"}]
        )
        return REFUSED

    def _every_refusal(
        self, body: bytes, target: Any, first: msgspec.ValidationError
    ) -> list[dict[str, str]]:
        """Every field of the body its type refuses, not only the first (the body as plain data, searched
        whole), then what the checks after decoding refuse in the rest (``checked``: a value's error, as
        the domain's are); none when it is not JSON past the first refusal (the first alone is
        reported)."""
        try:
            raw = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):
            return []
        found = decoding.salvaged(raw, target, first)
        items = [
            {"message": r.raw, "key": "data", "source": "body", "field": r.field, "plain": r.message}
            for r in found.refusals
        ]
        if found.value is not None:
            checked = found.named(check_body(target, found.value, runtime_of(self)))
            items += [
                {
                    "message": message,
                    "key": "data",
                    "source": "body",
                    "field": field or "body",
                    "checked": "yes",
                }
                for field, message in checked
            ]
        return items


def held_refusal(request: Request[Any, Any, Any]) -> ValidationException | None:
    """The refusal of the request's body, when its decoding held one."""
    state = request.scope.get("state") or {}
    refusal = state.get(_HELD)
    return refusal if isinstance(refusal, ValidationException) else None
