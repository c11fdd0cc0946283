"""Route handlers: decode, call one domain function, encode.

The typed envelopes of list responses live here, so that the OpenAPI document names what a page holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import msgspec

T = TypeVar("T")


class Page(msgspec.Struct, Generic[T], kw_only=True, frozen=True):
    """A page of a list: pass ``next`` as ``after`` for the following page; null on the last one."""

    items: list[T]
    #: The cursor of the following page, an id as every ``after`` takes; null on the last page.
    next: uuid.UUID | None


class Items(msgspec.Struct, Generic[T], kw_only=True, frozen=True):
    """Every item (a list short enough not to be paged)."""

    items: list[T]


def as_page(page: dict[str, Any]) -> Page[Any]:
    """A :class:`Page` from :func:`services.api.deps.page`'s ``{"items", "next"}`` (the handler's return
    annotation, ``Page[Contact]``, says what the items are)."""
    return Page(items=page["items"], next=page["next"])


def as_items(items: Sequence[T]) -> Items[T]:
    return Items(items=list(items))
