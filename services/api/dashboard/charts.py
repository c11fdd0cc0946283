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


def funnel(stats: SequenceStatistics) -> Chart:
    """A row per stage: enrolled, then each step's messages queued; each step's replies beside it."""
    rows: list[tuple[str, int, int | None]] = [("Enrolled", stats.enrolled, None)]
    rows += [(f"Step {s.step_index + 1} queued", s.sent, s.replies) for s in stats.steps]
    top = max([value for _, value, _ in rows] + [1])
    plot = WIDTH - LABEL_WIDTH - 150
    bars: list[Bar] = []
    labels: list[tuple[float, float, str, str]] = []
    for index, (label, value, replies) in enumerate(rows):
        y = 10 + index * ROW_HEIGHT
        width = plot * value / top
        bars.append(Bar(label, value, LABEL_WIDTH, y, max(width, 1 if value else 0), BAR_HEIGHT, "#0b5cad"))
        labels.append((LABEL_WIDTH - 8, y + BAR_HEIGHT - 5, label, "end"))
        text = str(value) if replies is None else f"{value} ({replies} replied)"
        labels.append((LABEL_WIDTH + width + 6, y + BAR_HEIGHT - 5, text, "start"))
        if replies:
            reply_width = plot * replies / top
            bars.append(
                Bar(f"{label}: replied", replies, LABEL_WIDTH, y + BAR_HEIGHT - 6, reply_width, 6, "#1e7a3c")
            )
    description = "; ".join(
        f"{label}: {value}" + ("" if replies is None else f", {replies} replied")
        for label, value, replies in rows
    )
    return Chart(WIDTH, 20 + len(rows) * ROW_HEIGHT, bars, labels, description)


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
