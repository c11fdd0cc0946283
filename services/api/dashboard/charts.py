"""Server-rendered SVG charts of a sequence's results: the funnel per step and the daily activity.

Only geometry is computed here; the templates draw it (``results.html``) with SVG presentation attributes
(no inline style, which the Content-Security-Policy refuses), a ``<title>`` and a text description, and
every number is in the table beside the chart too.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.common.followups.statistics import DailyActivity, SequenceStatistics

#: Width of a chart's drawing (it scales down on narrow screens).
WIDTH = 640
LABEL_WIDTH = 150
ROW_HEIGHT = 30
BAR_HEIGHT = 20


@dataclass(frozen=True)
class Bar:
    label: str
    value: int
    x: float
    y: float
    width: float
    height: float
    fill: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    #: Axis and value labels: (x, y, text, anchor).
    labels: list[tuple[float, float, str, str]]
    description: str


#: A step's messages in the funnel, by latest status: (field of MessageCounts, label, colour), in the
#: order the bar stacks them (the furthest along first; green good, amber waiting, red bad).
FUNNEL_SEGMENTS = (
    ("read", "read", "#145a2c"),
    ("delivered", "delivered", "#1e7a3c"),
    ("sent", "sent", "#5fae7a"),
    ("processing", "with the send lane", "#c99a00"),
    ("queued", "queued", "#e8c766"),
    ("failed", "failed", "#b3261e"),
    ("cancelled", "cancelled", "#d98c86"),
    ("deleted", "deleted", "#9aa3ad"),
)


def funnel(stats: SequenceStatistics) -> Chart:
    """A row per stage: enrolled, then each step's messages as one bar stacked by latest status (the
    numbers of ``GET /v1/sequences/{id}/statistics``), its replies as a thin bar beneath."""
    top = max([stats.enrolled] + [s.messages.total for s in stats.steps] + [1])
    plot = WIDTH - LABEL_WIDTH - 150
    bars: list[Bar] = []
    labels: list[tuple[float, float, str, str]] = []
    descriptions = [f"Enrolled: {stats.enrolled}"]
    y = 10.0
    width = plot * stats.enrolled / top
    bars.append(Bar("Enrolled", stats.enrolled, LABEL_WIDTH, y, width, BAR_HEIGHT, "#0b5cad"))
    labels.append((LABEL_WIDTH - 8, y + BAR_HEIGHT - 5, "Enrolled", "end"))
    labels.append((LABEL_WIDTH + width + 6, y + BAR_HEIGHT - 5, str(stats.enrolled), "start"))
    for index, step in enumerate(stats.steps, start=1):
        y = 10 + index * ROW_HEIGHT
        label = f"Step {step.step_index + 1}"
        x = float(LABEL_WIDTH)
        parts = []
        for name, text, fill in FUNNEL_SEGMENTS:
            value = getattr(step.messages, name)
            if value:
                segment = plot * value / top
                bars.append(Bar(f"{label}: {text}", value, x, y, segment, BAR_HEIGHT - 6, fill))
                x += segment
                parts.append(f"{value} {text}")
        if step.replied:
            reply_width = plot * step.replied / top
            bars.append(
                Bar(
                    f"{label}: replied",
                    step.replied,
                    LABEL_WIDTH,
                    y + BAR_HEIGHT - 5,
                    reply_width,
                    5,
                    "#0b5cad",
                )
            )
        labels.append((LABEL_WIDTH - 8, y + BAR_HEIGHT - 5, label, "end"))
        labels.append((x + 6, y + BAR_HEIGHT - 5, f"{step.messages.total} ({step.replied} replied)", "start"))
        descriptions.append(
            f"{label}: {step.messages.total} messages"
            + (f" ({', '.join(parts)})" if parts else "")
            + f", {step.replied} replied, {step.skipped} skipped, {step.stopped} stopped before it"
        )
    return Chart(WIDTH, 20 + (len(stats.steps) + 1) * ROW_HEIGHT, bars, labels, "; ".join(descriptions))


def daily(days: list[DailyActivity]) -> Chart:
    """Per day: enrollments made (light) and messages queued (dark), side by side."""
    height, bottom, left = 220, 190, 40
    top = max([max(d.enrolled, d.queued) for d in days] + [1])
    slot = (WIDTH - left - 10) / max(len(days), 1)
    bar = max(slot / 2 - 1, 1)
    bars: list[Bar] = []
    for index, day in enumerate(days):
        x = left + index * slot
        for offset, (name, value, fill) in enumerate(
            (("enrolled", day.enrolled, "#9fc2e7"), ("queued", day.queued, "#0b5cad"))
        ):
            h = (bottom - 20) * value / top
            bars.append(Bar(f"{day.day:%Y-%m-%d} {name}", value, x + offset * bar, bottom - h, bar, h, fill))
    labels: list[tuple[float, float, str, str]] = [
        (left - 6, 24, str(top), "end"),
        (left - 6, bottom, "0", "end"),
    ]
    if days:
        labels += [
            (left, bottom + 18, f"{days[0].day:%b %d}", "start"),
            (WIDTH - 10, bottom + 18, f"{days[-1].day:%b %d}", "end"),
        ]
    total_enrolled = sum(d.enrolled for d in days)
    total_queued = sum(d.queued for d in days)
    description = f"Last {len(days)} days: {total_enrolled} enrolled, {total_queued} messages queued."
    return Chart(WIDTH, height, bars, labels, description)
