"""Server-rendered SVG charts of the per-minute figures: no script, no chart library."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from conveyor.store.protocol import MinuteStats

WIDTH = 600
HEIGHT = 120


@dataclass(frozen=True, slots=True)
class Chart:
    """One series drawn as an SVG path, with a text summary for screen readers."""

    title: str
    unit: str
    path: str  # the "d" of an area path in a WIDTH x HEIGHT box
    peak: float
    total: float
    summary: str


def _series(
    stats: list[MinuteStats], start: datetime, minutes: int
) -> tuple[list[float], list[float], list[float | None]]:
    ended = [0.0] * minutes
    failed = [0.0] * minutes
    wait: list[float | None] = [None] * minutes
    first = int(start.timestamp() // 60)
    for s in stats:
        i = int(s.minute.timestamp() // 60) - first
        if 0 <= i < minutes:
            ended[i] = float(s.succeeded + s.failed)
            failed[i] = float(s.failed)
            wait[i] = s.wait_seconds
    return ended, failed, wait


def _path(values: list[float], peak: float) -> str:
    if not values:
        return ""
    step = WIDTH / max(1, len(values) - 1)
    scale = (HEIGHT - 4) / peak if peak > 0 else 0.0
    points = [f"{i * step:.1f},{HEIGHT - v * scale:.1f}" for i, v in enumerate(values)]
    return f"M0,{HEIGHT} L" + " L".join(points) + f" L{WIDTH},{HEIGHT} Z"


def _chart(title: str, unit: str, values: list[float], window: str, mean: bool = False) -> Chart:
    peak = max(values, default=0.0)
    total = sum(values)
    if mean:
        busy = [v for v in values if v > 0]
        figure = sum(busy) / len(busy) if busy else 0.0
        summary = f"{title} over the last {window}: mean {figure:.2f} {unit}, peak {peak:.2f}"
    else:
        summary = f"{title} over the last {window}: {total:.0f} in all, peak {peak:.0f} {unit}"
    return Chart(title, unit, _path(values, peak), peak, total, summary)


def overview_charts(stats: list[MinuteStats], now: datetime) -> dict[str, list[Chart]]:
    """Ended, failed and queue wait per minute, over the last hour and the last day."""
    out: dict[str, list[Chart]] = {}
    for window, minutes in (("hour", 60), ("day", 1440)):
        start = now - timedelta(minutes=minutes - 1)
        start = start.replace(second=0, microsecond=0)
        ended, failed, wait = _series(stats, start, minutes)
        out[window] = [
            _chart("Jobs ended", "per minute", ended, window),
            _chart("Failures", "per minute", failed, window),
            _chart("Queue wait", "s", [w or 0.0 for w in wait], window, mean=True),
        ]
    return out
