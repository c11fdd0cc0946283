"""Server-rendered SVG charts of a sequence's results: the funnel per step, the funnel per path of its
branches, waits and splits, each experiment's conversion intervals, and the daily activity.

Only geometry is computed here; the templates draw it (``results.html``) with SVG presentation attributes
(no inline style, which the Content-Security-Policy refuses), a ``<title>`` and a text description, and
every number is in the table beside the chart too.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.common.followups.statistics import (
    DailyActivity,
    ExperimentStatistics,
    PathStatistics,
    SequenceStatistics,
)

#: Width of a chart's drawing (it scales down on narrow screens).
WIDTH = 640
LABEL_WIDTH = 150
ROW_HEIGHT = 30
BAR_HEIGHT = 20
#: The paths' funnel names a step and its path on two lines left of its bars.
PATH_LABEL_WIDTH = 210


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


#: A path's funnel: (field of PathStatistics, label, colour), each bar beneath the one before.
PATH_STAGES = (
    ("entered", "entered", "#0b5cad"),
    ("sent", "sent a follow-up", "#5fae7a"),
    ("replied", "replied", "#c99a00"),
    ("converted", "converted", "#145a2c"),
)
#: A control step's kind as the results page words it.
KIND_LABELS = {"branch": "branch", "wait_for_reply": "wait for a reply", "split": "split"}


def path_label(path: PathStatistics) -> str:
    """A path as the results page names it: ``Step 3 split: variant a``."""
    name = path.path
    for prefix, word in (("path:", "path "), ("variant:", "variant ")):
        if name.startswith(prefix):
            name = word + name.removeprefix(prefix)
    name = {"no_reply": "no reply"}.get(name, name)
    return f"Step {path.step_index + 1} {KIND_LABELS[path.kind]}: {name}"


def path_funnel(paths: list[PathStatistics]) -> Chart:
    """A group of rows per path: the enrollments that took it, then of those the ones sent a follow-up
    after it, that replied, that converted (the numbers of ``paths`` in the statistics)."""
    top = max([p.entered for p in paths] + [1])
    left = PATH_LABEL_WIDTH
    plot = WIDTH - left - 140
    stage = 15.0
    group = stage * len(PATH_STAGES) + 14
    bars: list[Bar] = []
    labels: list[tuple[float, float, str, str]] = []
    descriptions = []
    for index, path in enumerate(paths):
        label = path_label(path)
        y = 10 + index * group
        for position, (name, text, fill) in enumerate(PATH_STAGES):
            value = getattr(path, name)
            width = plot * value / top
            row = y + position * stage
            bars.append(Bar(f"{label}: {text}", value, left, row, width, stage - 3, fill))
            labels.append((left + width + 4, row + stage - 4, f"{value} {text}", "start"))
        step, name = label.split(": ", 1)
        labels.append((left - 8, y + stage + 8, name, "end"))
        labels.append((left - 8, y + 3 * stage - 2, step, "end"))
        descriptions.append(
            f"{label}: {path.entered} entered, {path.sent} sent a follow-up, {path.replied} replied,"
            f" {path.converted} converted"
        )
    return Chart(WIDTH, int(20 + len(paths) * group), bars, labels, "; ".join(descriptions))


def intervals(experiment: ExperimentStatistics) -> Chart:
    """Per variant its conversion rate (a dot, drawn as a short bar) and its 95 % interval (a line, drawn
    as a thin bar), on a 0 to 100 % axis."""
    plot = WIDTH - LABEL_WIDTH - 30
    bars: list[Bar] = []
    labels: list[tuple[float, float, str, str]] = [
        (LABEL_WIDTH, 16, "0 %", "start"),
        (LABEL_WIDTH + plot, 16, "100 %", "end"),
    ]
    descriptions = []
    measured = [v for v in experiment.variants if v.conversion_interval is not None]
    for index, variant in enumerate(measured):
        assert variant.conversion_interval is not None and variant.conversion_rate is not None
        low, high = variant.conversion_interval
        y = 26 + index * ROW_HEIGHT
        fill = "#145a2c" if variant.variant == experiment.winner else "#0b5cad"
        bars.append(
            Bar(
                f"{variant.variant}: 95 % interval",
                variant.converted,
                LABEL_WIDTH + plot * low,
                y + 8,
                max(plot * (high - low), 1),
                4,
                "#9fc2e7",
            )
        )
        rate = LABEL_WIDTH + plot * variant.conversion_rate
        bars.append(
            Bar(f"{variant.variant}: conversion rate", variant.converted, rate - 2, y + 2, 4, 16, fill)
        )
        labels.append((LABEL_WIDTH - 8, y + 15, variant.variant, "end"))
        descriptions.append(
            f"{variant.variant}: {variant.converted} of {variant.assigned} converted,"
            f" {variant.conversion_rate:.1%} (95 % interval {low:.1%} to {high:.1%})"
        )
    text = "; ".join(descriptions) or "Nobody was assigned a variant yet."
    return Chart(WIDTH, int(36 + len(measured) * ROW_HEIGHT), bars, labels, text)


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
