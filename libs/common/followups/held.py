"""What held a step back, with the values compared: the release path's part of the decision trace.

A release that does not send records why in the row it writes anyway: a skipped step's run
(``followup_step_runs.reason`` and ``reason_values``), a deferred enrollment (``waiting_reason`` and
``waiting_values``, until it moves on). The values are a small JSON object per reason, built only when the
step is held (the sending path builds none):

    send_window             opens_at, local (HH:MM), day, timezone, window {start, end, days}
    contact_cap             sent, limit, until, local (HH:MM), timezone
    pacing                  number_id, slot (the number's next free one, reserved), gap_ms
    in_flight               in_flight, limit, number_id
    quota                   used, limit
    backlog                 backlog, limit
    instance_unavailable    unavailable_since
    busy                    locked (contact, conversation or pacing), number_id
    no_consent              consent, consent_mode
    outside_service_window  last_inbound_at (null: never), without_template
    only_if                 the condition's state: replied_at, last_message_status
    past_due, rescheduled   due_at (and grace_seconds)

:func:`explain` says them in words (``send window opens at 09:00 Europe/Lisbon``, ``contact cap 3/3
until 14:05 Europe/Lisbon``), as the dashboard shows them.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from typing import Any

from libs.common.followups.send_window import WEEKDAYS, SendWindow

#: The values one check compared (a JSON object).
HeldValues = dict[str, Any]


def moment(value: datetime | None) -> str | None:
    """An instant as the values keep it: RFC 3339 in UTC (None: never)."""
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def until(value: datetime, tz: tzinfo) -> HeldValues:
    """An instant and its wall-clock time in ``tz`` (the contact's zone, else the project's)."""
    local = value.astimezone(tz)
    return {"until": moment(value), "local": local.strftime("%H:%M"), "timezone": str(tz)}


def send_window(window: SendWindow | None, opening: datetime, tz: tzinfo) -> HeldValues:
    """A send window that is closed now: when it opens next, there and then."""
    local = opening.astimezone(tz)
    values: HeldValues = {
        "opens_at": moment(opening),
        "local": local.strftime("%H:%M"),
        "day": WEEKDAYS[local.weekday()],
        "timezone": str(tz),
    }
    if window is not None:
        values["window"] = {"start": window.start, "end": window.end, "days": list(window.days)}
    return values


def explain(reason: str | None, values: HeldValues | None) -> str:
    """The values of what held a step back, in words (empty: none kept)."""
    if not reason or not values:
        return ""
    v = values
    match reason:
        case "send_window":
            return f"send window opens at {v.get('local')} {v.get('timezone')} ({v.get('day')})"
        case "contact_cap":
            return f"contact cap {v.get('sent')}/{v.get('limit')} until {v.get('local')} {v.get('timezone')}"
        case "pacing":
            return f"pacing: the number's next slot at {_clock(v.get('slot'))} ({v.get('gap_ms')} ms apart)"
        case "in_flight":
            return f"{v.get('in_flight')}/{v.get('limit')} follow-ups in flight on the number"
        case "quota":
            return f"monthly quota used: {v.get('used')}/{v.get('limit')}"
        case "backlog":
            return f"send-lane backlog {v.get('backlog')} over its limit of {v.get('limit')}"
        case "instance_unavailable":
            return f"no connected number since {_clock(v.get('unavailable_since'))}"
        case "busy":
            return f"the {v.get('locked')} was busy (locked by another change): tried again shortly"
        case "no_consent":
            return f"consent is {v.get('consent')} and the project requires it"
        case "outside_service_window":
            last = v.get("last_inbound_at")
            wrote = f"last wrote {_clock(last)}" if last else "never wrote"
            return f"the contact {wrote} (the 24 h window is closed) and the step has no approved template"
        case "only_if":
            return ", ".join(f"{key.replace('_', ' ')} {_clock(value)}" for key, value in v.items())
        case "past_due":
            return f"due {_clock(v.get('due_at'))}, past its grace of {v.get('grace_seconds')} s"
        case "rescheduled":
            return f"due {_clock(v.get('due_at'))}"
    return ", ".join(f"{key} {value}" for key, value in v.items())


def _clock(value: Any) -> str:
    """An RFC 3339 instant as ``2030-01-07 14:05 UTC``; anything else as it is."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
        return parsed.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return str(value)
