"""Forms: reading posted fields, and the errors shown next to the fields they name.

Form fields are named with the REST API's field paths (``name``, ``execution_delay_minutes``,
``conditions.all.1.any.0.value``, ``definition.steps.2.text``), so an error of the domain, which names the
same path as the API's problem body, is shown next to the input it is about, with no table to keep in step.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import msgspec
from litestar import Request
from litestar.datastructures import FormMultiDict, UploadFile
from psycopg import Connection

from libs.common.core.errors import FollowupsError, NotFound
from libs.common.core.runtime import Runtime
from services.api.deps import transaction
from services.api.problems import status_of

_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`")

#: Units of a delay in the forms, in minutes (a rule's delay) or seconds (a step's wait).
MINUTE_UNITS = {"minutes": 1, "hours": 60, "days": 1440}
SECOND_UNITS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}


def field_id(name: str) -> str:
    """The HTML id of the input named ``name`` (``conditions.all.0.value``: ``f-conditions-all-0-value``)."""
    return "f-" + re.sub(r"[^A-Za-z0-9_-]", "-", name)


@dataclass
class FormErrors:
    """Errors by field path; ``""`` is an error about the whole form."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, message: str) -> None:
        self.items.append((name, message))

    def __bool__(self) -> bool:
        return bool(self.items)

    def for_(self, name: str) -> list[str]:
        """The messages about ``name`` or a field inside it (``labels`` takes ``labels.1``)."""
        return [message for where, message in self.items if where == name or where.startswith(name + ".")]

    def exact(self, name: str) -> list[str]:
        """The messages about ``name`` itself (not a field inside it)."""
        return [message for where, message in self.items if where == name]

    def about(self, prefix: str) -> list[tuple[str, str]]:
        """The errors inside ``prefix`` (with their full paths)."""
        return [(w, m) for w, m in self.items if w == prefix or w.startswith(prefix + ".")]

    def general(self) -> list[str]:
        return [message for where, message in self.items if not where]

    def summary(self) -> list[tuple[str, str, str]]:
        """``(field, message, html id)`` of every error, for the summary at the top of a form."""
        return [(where, message, field_id(where) if where else "") for where, message in self.items]

    def renamed(self, names: Mapping[str, str]) -> FormErrors:
        """The errors with domain field names replaced by the form's (``contact_id`` -> ``contact``)."""
        out = FormErrors()
        for where, message in self.items:
            head, dot, rest = where.partition(".")
            out.add(names[head] + dot + rest if head in names else where, message)
        return out


def error_of(exc: FollowupsError) -> FormErrors:
    """A domain error as form errors: each on its field (a body checked whole names several), else on the
    whole form."""
    return FormErrors(list(exc.errors) or [(exc.field or "", exc.message)])


def validation_error(exc: msgspec.ValidationError, prefix: str = "") -> FormErrors:
    """A msgspec error (``Expected `int` >= 1 - at `$.execution_delay_minutes```) on the field it names."""
    text = str(exc)
    found = _AT_PATH.search(text)
    path = re.sub(r"\[(\d+)\]", r".\1", found.group(1)).strip(".") if found else ""
    where = ".".join(part for part in (prefix, path) if part)
    message = _AT_PATH.sub("", text)
    return FormErrors([(where, message)])


class Form:
    """The posted fields of a request (read by the dashboard's request hook before the handler runs)."""

    def __init__(self, data: FormMultiDict) -> None:
        self._data = data

    @classmethod
    def of(cls, request: Request[Any, Any, Any]) -> Form:
        data: FormMultiDict | None = request.state.get("dashboard_form")
        return cls(data if data is not None else FormMultiDict({}))

    def get(self, name: str, default: str = "") -> str:
        value = self._data.get(name)
        return value if isinstance(value, str) else default

    def getall(self, name: str) -> list[str]:
        return [value for value in self._data.getall(name, []) if isinstance(value, str)]

    def file(self, name: str) -> UploadFile | None:
        value = self._data.get(name)
        return value if isinstance(value, UploadFile) else None

    def checked(self, name: str) -> bool:
        return self.get(name) in ("on", "true", "1", "yes")

    def names(self) -> list[str]:
        return list(self._data.keys())

    def items(self, prefix: str) -> dict[str, str]:
        """Every text field whose name starts with ``prefix``."""
        return {
            key: value
            for key, value in self._data.multi_items()
            if key.startswith(prefix) and isinstance(value, str)
        }


def whole_number(
    raw: str, name: str, errors: FormErrors, *, required: bool = False, what: str = "a whole number"
) -> int | None:
    """An integer typed into a form (None when left empty and not required)."""
    text = raw.strip()
    if not text:
        if required:
            errors.add(name, f"{name.rsplit('.', 1)[-1]} is required")
        return None
    try:
        return int(text)
    except ValueError:
        errors.add(name, f"{text!r} is not {what}")
        return None


def comma_list(raw: str) -> list[str]:
    """``vip, lead`` -> ``["vip", "lead"]`` (empty items dropped)."""
    return [item.strip() for item in raw.split(",") if item.strip()]


def lines(raw: str) -> list[str]:
    return [line.strip() for line in raw.splitlines() if line.strip()]


def key_values(raw: str, name: str, errors: FormErrors) -> dict[str, str]:
    """``key=value`` lines as an object (template variables)."""
    out: dict[str, str] = {}
    for line in lines(raw):
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            errors.add(name, f"{line!r} is not key=value")
            continue
        out[key.strip()] = value.strip()
    return out


def key_value_text(values: Mapping[str, Any]) -> str:
    return "\n".join(f"{key}={value}" for key, value in values.items())


def split_delay(amount: int | None, units: Mapping[str, int]) -> tuple[str, str]:
    """A delay as the form shows it: the largest unit that divides it (240 minutes: ``4`` ``hours``)."""
    if not amount:
        return "", next(iter(units))
    for unit, size in sorted(units.items(), key=lambda item: -item[1]):
        if amount % size == 0:
            return str(amount // size), unit
    return str(amount), next(iter(units))


def join_delay(
    value: str, unit: str, units: Mapping[str, int], name: str, errors: FormErrors, *, required: bool
) -> int | None:
    """A delay typed as a number and a unit, in the units' base (minutes or seconds)."""
    amount = whole_number(value, name, errors, required=required)
    if amount is None:
        return None
    if unit not in units:
        errors.add(name, f"unknown unit {unit!r}")
        return None
    return amount * units[unit]


def choices(values: Iterable[str]) -> list[tuple[str, str]]:
    return [(value, value.replace("_", " ")) for value in values]


def back_to_card(request: Any, default: str) -> str:
    """Where an action returns: the contact card it was pressed on (the form's ``back``, a dashboard path
    under ``/app/contacts/`` only, never another site), else ``default``."""
    back = Form.of(request).get("back")
    if back.startswith("/app/contacts/") and "//" not in back and "\\" not in back:
        return back
    return default


def anchor_time(raw: str, errors: FormErrors, field: str, what: str = "the anchor") -> datetime | None:
    """A time (an anchor, an expiry) typed as ``YYYY-MM-DDTHH:MM`` (a datetime-local input), taken as UTC
    without an offset; None when empty, or when malformed (then an error on ``field`` about ``what``)."""
    if not raw.strip():
        return None
    try:
        moment = datetime.fromisoformat(raw.strip())
    except ValueError:
        errors.add(field, f"{what} is a date and time such as 2025-03-01T14:00")
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


_Answer = TypeVar("_Answer")


@dataclass(frozen=True)
class Tried(Generic[_Answer]):
    """What a form that asks the domain a question came to: the answer, or the errors to show next to the
    form's inputs and the page's status."""

    answer: _Answer | None
    errors: FormErrors
    status: int


def try_form(
    runtime: Runtime,
    attempt: Callable[[Connection[Any], FormErrors], _Answer | None],
    fields: Mapping[str, str],
    owner: str,
) -> Tried[_Answer]:
    """Run ``attempt`` (it reads the form into a request, adding errors, and asks the domain; None when the
    form made no request) in one transaction. A refusal of the request's types or of the domain is shown next
    to the form's inputs (``fields``: the domain's field names to the inputs'); a NotFound naming ``owner``,
    the page's own resource (another project's rule, say), is raised: the 404 page."""
    errors = FormErrors()
    try:
        with transaction(runtime) as conn:
            answer = attempt(conn, errors)
    except msgspec.ValidationError as exc:
        return Tried(None, validation_error(exc).renamed(fields), 422)
    except FollowupsError as exc:
        if isinstance(exc, NotFound) and exc.field == owner:
            raise
        return Tried(None, error_of(exc).renamed(fields), status_of(exc))
    return Tried(answer, errors, 200 if answer is not None else 422)
