"""Pages: the Jinja environment (every value escaped), the context every page gets, and the response.

Templates live in ``templates/``; ``autoescape`` is on for every template and ``StrictUndefined`` turns a
misspelt name into an error instead of an empty string. Every page is sent with a Content-Security-Policy
that allows only the dashboard's own script and style files: an injected ``<script>`` would not run even
if it escaped the escaping.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import jinja2
from litestar import Request, Response
from litestar.enums import MediaType
from markupsafe import Markup

from libs.common.contracts.labels import label
from libs.common.followups.held import explain
from libs.common.platform.api_keys import allows
from services.api.dashboard.forms import FormErrors, field_id
from services.api.dashboard.session import CSRF_FIELD, Session, Signer

#: Headers of every dashboard response.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

#: The navigation: (path, label, the scope a session needs to see the link).
NAVIGATION = (
    ("/app/sequences", "Sequences", "read"),
    ("/app/enrollments", "Enrollments", "read"),
    ("/app/bulk", "Bulk", "read"),
    ("/app/rules", "Rules", "read"),
    ("/app/contacts", "Contacts", "read"),
    ("/app/settings", "Settings", "read"),
    ("/app/api-keys", "API keys", "admin"),
)


#: What a page says after an action redirected to it (``?notice=saved``): fixed texts, never the URL's.
NOTICES = {
    "signed_out": "You are signed out.",
    "revoked": "Revoked: the key authenticates as nothing, and its dashboard sessions have ended.",
    "saved": "Saved.",
    "created": "Created.",
    "deleted": "Deleted.",
    "published": "Published: new enrollments use the new version.",
    "winner_chosen": "Winner chosen: a new version sends everyone who reaches the split down its path.",
    "paused": "Paused.",
    "resumed": "Resumed.",
    "archived": "Archived: no new enrollments; running ones carry on.",
    "stopped": "Stopped.",
    "enrolled": "Enrolled.",
    "enabled": "Enabled.",
    "disabled": "Disabled.",
    "cancelled": "Cancelled: its actions will not run.",
    "not_pending": "Not cancelled: it is no longer pending (it ran, or was skipped).",
}


def relative(value: datetime, now: datetime) -> str:
    """How far ``value`` is from ``now``, in its largest whole unit: ``in 25 s``, ``3 min ago``, ``now``."""
    seconds = (value - now).total_seconds()
    size = abs(seconds)
    if size < 1:
        return "now"
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if size >= length:
            amount = f"{int(size // length)} {unit}"
            return f"in {amount}" if seconds > 0 else f"{amount} ago"
    return "now"  # unreachable: size >= 1


def moment(value: datetime | None) -> str:
    """A moment to the second: ``2025-03-01 14:05:07 UTC``."""
    if value is None:
        return "—"
    if value.utcoffset() is None:
        return value.isoformat()
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def instant(value: datetime) -> str:
    """A moment as a machine reads it (a ``<time>``'s ``datetime``): ``2025-03-01T14:05:07.000Z``."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@jinja2.pass_context
def when(context: jinja2.runtime.Context, value: datetime | None) -> Markup | str:
    """A moment as the dashboard shows it: to the second, and how far from the page's ``now`` (the
    runtime's clock when the page was drawn): ``2025-03-01 14:05:07 UTC (in 25 s)``, a ``<time>`` whose
    ``.relative`` part the page's script keeps true as time passes (``static/dashboard.js``)."""
    text = moment(value)
    now = context.get("now")
    if value is None or value.utcoffset() is None or not isinstance(now, datetime):
        return text
    return Markup('<time datetime="{}">{} <span class="relative">({})</span></time>').format(
        instant(value), text, relative(value, now)
    )


#: What a status (or a stopped enrollment's reason) says, as its colour: went well, went badly, waits.
GOOD = frozenset(
    {"completed", "replied", "active", "executed", "connected", "SENT", "DELIVERED", "READ", "RECEIVED"}
)
BAD = frozenset({"failed", "FAILED", "opted_out", "disconnected", "contact_erased", "error"})
WAITING = frozenset({"paused", "pending", "draft", "queued", "running", "QUEUED", "PROCESSING"})


def tone(status: str, reason: str | None = None) -> str:
    """``good``, ``bad``, ``wait`` or ``neutral``: a stopped enrollment by its reason (a reply is good news,
    an opt-out bad, a stop by hand neither)."""
    value = reason if status == "stopped" and reason else status
    if value in GOOD:
        return "good"
    if value in BAD:
        return "bad"
    return "wait" if value in WAITING else "neutral"


def duration(seconds: int | float | None) -> str:
    """Seconds as ``1d 2h``, ``45m``, ``30s`` (``0s`` for none)."""
    if not seconds:
        return "0s"
    total = int(abs(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return ("-" if seconds < 0 else "") + " ".join(parts)


def step_of(enrollment: Any) -> str:
    """The step an enrollment is at, counted from 1: a live one's next step; a finished one's last step
    run or skipped (``step_index`` has moved past it), "—" when none ran."""
    if enrollment.status in ("active", "paused"):
        return str(enrollment.step_index + 1)
    return str(enrollment.step_index) if enrollment.step_index else "—"


def short(value: uuid.UUID | str | None) -> str:
    """An id's first 8 characters (the full id is in the link or the title)."""
    return "—" if value is None else str(value)[:8]


def percent(part: int, whole: int) -> str:
    return "—" if not whole else f"{math.floor(100 * part / whole)}%"


def held_back(enrollment: Any) -> str:
    """What a live enrollment waits for, with the values its check compared (``send window opens at 09:00
    Europe/Lisbon (tue)``); empty when it waits for nothing."""
    return explain(enrollment.waiting_reason, enrollment.waiting_values)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("services.api.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=when,
        moment=moment,
        instant=instant,
        duration=duration,
        short=short,
        label=label,
        step=step_of,
        held=held_back,
    )
    env.globals.update(tone=tone, percent=percent, navigation=NAVIGATION, field_id=field_id, allows=allows)
    return env


#: Built once per process.
ENVIRONMENT = _environment()


def dashboard_of(request: Request[Any, Any, Any]) -> Signer:
    signer: Signer = request.route_handler.opt["dashboard_signer"]
    return signer


def session_of(request: Request[Any, Any, Any]) -> Session | None:
    session: Session | None = request.state.get("dashboard_session")
    return session


def csrf_input(request: Request[Any, Any, Any]) -> Markup:
    """The hidden field every form carries."""
    token = dashboard_of(request).csrf_token(request.state.get("dashboard_nonce") or "")
    return Markup('<input type="hidden" name="{}" value="{}">').format(CSRF_FIELD, token)


def render_text(request: Request[Any, Any, Any], template: str, **context: Any) -> str:
    nonce = request.state.get("dashboard_nonce") or ""
    values = {
        "now": request.app.state.runtime.clock.now(),
        "request_path": request.url.path,
        "session": session_of(request),
        "csrf": csrf_input(request),
        "csrf_token": dashboard_of(request).csrf_token(nonce),
        "errors": FormErrors(),
        "notice": NOTICES.get(request.query_params.get("notice") or ""),
        **context,
    }
    return ENVIRONMENT.get_template(template).render(values)


def page(
    request: Request[Any, Any, Any],
    template: str,
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> Response[str]:
    """A full page (or a fragment: the template decides) as an HTML response."""
    return Response(
        render_text(request, template, **context),
        status_code=status,
        media_type=MediaType.HTML,
        headers={**SECURITY_HEADERS, **(headers or {})},
    )


def options(values: Iterable[str]) -> list[tuple[str, str]]:
    """``(value, label)`` pairs of plain values."""
    return [(value, value) for value in values]
