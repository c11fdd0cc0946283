"""A recorded reason: a closed code and, for some codes, a detail (``only_if`` and the condition not met,
``missing_variable`` and the placeholder's path), kept in one text column as ``code`` or ``code:detail``
and answered as two fields (``reason`` and ``reason_detail``, ``skip_reason`` and ``skip_detail``).

A writer takes its code typed, a ``Literal`` of the context that owns the column (mypy refuses a code that
is not listed), and its detail; :func:`stored` joins them. A read splits what is stored with :func:`split`:
a code the reader does not list (a row written by an older or a newer version) is answered as
:data:`OTHER` with the stored text whole as its detail, so no row fails to read and no answer leaves its
enum.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final, Literal, TypeVar, cast

#: The code a read answers for a stored code it does not list.
Other = Literal["other"]
OTHER: Final[Other] = "other"

_Code = TypeVar("_Code", bound=str)


def stored(code: str, detail: str | None = None) -> str:
    """The text a column keeps: ``code``, or ``code:detail``."""
    return code if detail is None else f"{code}:{detail}"


def split(text: str | None, codes: Collection[_Code]) -> tuple[_Code | Other | None, str | None]:
    """The code and the detail of what :func:`stored` wrote (None, None for nothing); a code not among
    ``codes`` is :data:`OTHER`, with ``text`` as its detail."""
    if text is None:
        return None, None
    code, colon, detail = text.partition(":")
    if code in codes:
        return cast(_Code, code), detail if colon else None
    return OTHER, text
