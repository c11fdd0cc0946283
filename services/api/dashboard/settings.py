"""Settings: the project's time zone, the send window, consent mode, caps, pacing, quotas, retention,
business hours and the AI budget (``PUT /v1/settings``: the form replaces them all), with the numbers and
their status and the AI model this deployment uses."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post

from libs.common.ai.step import month_tokens
from libs.common.core import decoding
from libs.common.core.errors import FollowupsError, InvalidInput
from libs.common.followups import project_settings
from libs.common.followups.project_settings import ProjectSettings
from libs.common.followups.send_window import WEEKDAYS
from libs.common.platform import numbers
from services.api.dashboard.base import project_of, see_other
from services.api.dashboard.forms import Form, FormErrors, error_of, whole_number
from services.api.dashboard.render import page
from services.api.deps import runtime_of, transaction
from services.api.problems import status_of

#: The optional whole numbers of the settings (empty: no limit), and the two that have a default.
LIMITS = (
    "max_per_contact_24h",
    "max_per_contact_day",
    "max_in_flight_per_number",
    "monthly_message_quota",
    "max_send_lane_backlog",
    "ai_monthly_token_budget",
)
DEFAULTED = {
    name: getattr(project_settings.DEFAULTS, name)
    for name in ("send_delay_ms", "min_recipient_gap_seconds", "retention_days")
}
WINDOWS = ("send_window", "business_hours")


def values_of(settings: ProjectSettings) -> dict[str, Any]:
    """The settings as the form shows them."""
    out: dict[str, Any] = {
        "timezone": settings.timezone if isinstance(settings.timezone, str) else "UTC",
        "consent_mode": settings.consent_mode,
        "service_window": settings.service_window,
    }
    for name in (*LIMITS, *DEFAULTED):
        value = getattr(settings, name)
        out[name] = "" if value is None else str(value)
    for name in WINDOWS:
        window = getattr(settings, name)
        out[name] = {
            "enabled": window is not None,
            "start": window.start if window else "09:00",
            "end": window.end if window else "18:00",
            "days": list(window.days) if window else list(WEEKDAYS[:5]),
        }
    return out


class SettingsController(Controller):
    path = "/settings"

    @get("/", sync_to_thread=True)
    def read(self, request: Request[Any, Any, Any]) -> Response[str]:
        with transaction(runtime_of(request)) as conn:
            settings = project_settings.get_settings(conn, project_of(request))
        return self._page(request, values_of(settings), FormErrors())

    @post("/", sync_to_thread=True)
    def replace(self, request: Request[Any, Any, Any]) -> Response[str]:
        form = Form.of(request)
        values: dict[str, Any] = {
            "timezone": form.get("timezone").strip(),
            "consent_mode": form.get("consent_mode"),
            "service_window": form.get("service_window"),
        }
        errors = FormErrors()
        payload: dict[str, Any] = {
            "timezone": values["timezone"] or "UTC",
            "consent_mode": values["consent_mode"],
            "service_window": values["service_window"],
        }
        for name in (*LIMITS, *DEFAULTED):
            values[name] = form.get(name)
            number = whole_number(values[name], name, errors)
            payload[name] = DEFAULTED.get(name) if number is None and name in DEFAULTED else number
        for name in WINDOWS:
            values[name] = {
                "enabled": form.checked(f"{name}.enabled"),
                "start": form.get(f"{name}.start"),
                "end": form.get(f"{name}.end"),
                "days": form.getall(f"{name}.days"),
            }
            window = values[name]
            payload[name] = (
                {"start": window["start"], "end": window["end"], "days": window["days"]}
                if window["enabled"]
                else None
            )
        runtime = runtime_of(request)
        with transaction(runtime) as conn:  # what the form does not show is kept (the prices: the API's)
            kept = project_settings.get_settings(conn, project_of(request)).message_prices
        payload["message_prices"] = msgspec.to_builtins(kept) if kept is not None else None
        cap = runtime.settings.ai.max_monthly_tokens_per_project
        # every error at once: the form's numbers, the settings' types, the checks of what decodes
        settings, refused = decoding.salvage(payload, ProjectSettings)
        errors = FormErrors(errors.items + refused)
        try:
            if settings is not None:
                project_settings.check_settings(settings, ai_token_cap=cap)
        except InvalidInput as exc:
            errors = FormErrors(errors.items + error_of(exc).items)
        if errors or settings is None:
            return self._page(request, values, errors, status=422)
        try:
            with transaction(runtime) as conn:
                project_settings.put_settings(
                    conn, project_of(request), settings, now=runtime.clock.now(), ai_token_cap=cap
                )
        except FollowupsError as exc:
            return self._page(request, values, error_of(exc), status=status_of(exc))
        return see_other("/app/settings", notice="saved")

    def _page(
        self, request: Request[Any, Any, Any], values: dict[str, Any], errors: FormErrors, status: int = 200
    ) -> Response[str]:
        runtime = runtime_of(request)
        project_id = project_of(request)
        with transaction(runtime) as conn:
            found = numbers.list_numbers(conn, project_id, limit=200)
            tokens = month_tokens(conn, project_id, runtime.clock.now())
        ai = runtime.settings.ai
        return page(
            request,
            "settings.html",
            status=status,
            title="Settings",
            values=values,
            errors=errors,
            numbers=found,
            weekdays=WEEKDAYS,
            ai_model=ai.model,
            ai_configured=ai.base_url is not None,
            ai_tokens=tokens,
            ai_token_cap=ai.max_monthly_tokens_per_project,
            ai_budget=project_settings.ai_token_budget(
                int(typed) if (typed := values["ai_monthly_token_budget"]).isdigit() else None,
                ai.max_monthly_tokens_per_project,
            ),
        )
