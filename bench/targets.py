"""Conveyor's figures set against the floor of the same run and against issue 7's targets.

Each :class:`Check` names a conveyor metric, optionally the floor metric it is
compared with, and the target it should meet.  Only medians are compared, and
only within one run: figures from different sessions drift by 20-25%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table

# (workload, metric) -> median, as the runner summarised them.
Medians = dict[tuple[str, str], float]


@dataclass(frozen=True)
class Check:
    """One figure of conveyor's, its floor, and its target."""

    label: str
    workload: str
    metric: str
    floor: tuple[str, str] | None = None
    at_least: float | None = None
    at_most: float | None = None
    floor_share: float | None = None  # at least this fraction of the floor
    more_than: tuple[str, str] | None = None  # more than another conveyor figure
    note: str = ""

    def target(self) -> str:
        """The target in words, or an empty string."""
        if self.floor_share is not None:
            return f"≥ {self.floor_share:.0%} of floor"
        if self.at_least is not None:
            return f"≥ {self.at_least:,.6g}"
        if self.at_most is not None:
            return f"≤ {self.at_most:,.6g}"
        if self.more_than is not None:
            return f"> {self.more_than[0]}"
        return ""

    def evaluate(self, medians: Medians) -> dict[str, Any] | None:
        """The comparison as a JSON-ready dict, or None if the run lacks the figure."""
        value = medians.get((self.workload, self.metric))
        if value is None:
            return None
        floor = medians.get(self.floor) if self.floor is not None else None
        ratio = value / floor if floor else None
        met: bool | None = None
        if self.floor_share is not None:
            met = None if ratio is None else ratio >= self.floor_share
        elif self.at_least is not None:
            met = value >= self.at_least
        elif self.at_most is not None:
            met = value <= self.at_most
        elif self.more_than is not None:
            other = medians.get(self.more_than)
            met = None if other is None else value > other
        return {
            "label": self.label,
            "workload": self.workload,
            "metric": self.metric,
            "value": value,
            "floor": floor,
            "ratio_to_floor": ratio,
            "target": self.target(),
            "met": met,
            "note": self.note,
        }


_FLOOR_SINGLE = ("floor_enqueue_single", "jobs_per_s")
_FLOOR_BULK = ("floor_enqueue_bulk", "jobs_per_s")
_FLOOR_1 = ("floor_drain_1conn", "jobs_per_s")
_FLOOR_4 = ("floor_drain_4conn", "jobs_per_s")

_COMMON = [
    Check(
        "enqueue, one job per call",
        "conveyor_enqueue_single",
        "jobs_per_s",
        _FLOOR_SINGLE,
        floor_share=0.8,
    ),
]

CHECKS: dict[str, list[Check]] = {
    "postgres": [
        *_COMMON,
        Check(
            "enqueue, bulk",
            "conveyor_enqueue_bulk",
            "jobs_per_s",
            _FLOOR_BULK,
            at_least=50_000,
        ),
        Check("drain, 1 worker", "conveyor_drain_1proc", "jobs_per_s", _FLOOR_1, floor_share=0.6),
        Check(
            "drain, 1 worker, steady",
            "conveyor_drain_1proc",
            "steady_jobs_per_s",
            _FLOOR_1,
            at_least=17_000,
        ),
        Check(
            "drain, 4 workers",
            "conveyor_drain_4proc",
            "jobs_per_s",
            _FLOOR_4,
            more_than=("conveyor_drain_1proc", "jobs_per_s"),
        ),
        Check("drain, 4 workers, steady", "conveyor_drain_4proc", "steady_jobs_per_s", _FLOOR_4),
        Check("enqueue→start p50 (ms)", "conveyor_latency", "p50_ms", at_most=3),
        Check("enqueue→start p99 (ms)", "conveyor_latency", "p99_ms", at_most=8),
    ],
    "sqlite": [
        *_COMMON,
        Check("enqueue, bulk", "conveyor_enqueue_bulk", "jobs_per_s", _FLOOR_BULK),
        Check("drain, 1 worker", "conveyor_drain_1proc", "jobs_per_s", _FLOOR_1),
        Check(
            "drain, 1 worker, steady",
            "conveyor_drain_1proc",
            "steady_jobs_per_s",
            _FLOOR_1,
            at_least=10_000,
        ),
        Check("drain, 4 workers", "conveyor_drain_4proc", "jobs_per_s", _FLOOR_4),
        Check("drain, 4 workers, steady", "conveyor_drain_4proc", "steady_jobs_per_s", _FLOOR_4),
        Check("enqueue→start p50 (ms)", "conveyor_latency", "p50_ms", at_most=10),
        Check("enqueue→start p99 (ms)", "conveyor_latency", "p99_ms", at_most=30),
    ],
}

_TAIL = [
    Check(
        "scale: drain, loaded ÷ small table",
        "conveyor_scale",
        "drain_loaded_vs_empty",
        at_least=0.8,
    ),
    Check(
        "scale: claim latency, loaded ÷ small table",
        "conveyor_scale",
        "claim_1_loaded_vs_empty",
        at_most=1.2,
    ),
    Check("RSS with 1,000 running jobs (MB)", "conveyor_heartbeat", "rss_mb", at_most=150),
]
for _checks in CHECKS.values():
    _checks.extend(_TAIL)


def compare(backend: str, medians: Medians) -> list[dict[str, Any]]:
    """Evaluate every check of ``backend`` that the run has figures for."""
    found = (check.evaluate(medians) for check in CHECKS[backend])
    return [row for row in found if row is not None]


def render(backend: str, rows: list[dict[str, Any]]) -> Table:
    """The comparison as a table: conveyor, the floor, their ratio, the target, met or not."""
    table = Table(title=f"conveyor against the floor and issue 7's targets: {backend}")
    table.add_column("figure")
    table.add_column("conveyor", justify="right")
    table.add_column("floor", justify="right")
    table.add_column("÷ floor", justify="right")
    table.add_column("target", justify="right")
    table.add_column("met", justify="center")
    for row in rows:
        table.add_row(
            row["label"],
            _number(row["value"]),
            _number(row["floor"]) if row["floor"] is not None else "",
            f"{row['ratio_to_floor']:.2f}×" if row["ratio_to_floor"] is not None else "",
            row["target"],
            {True: "yes", False: "NO", None: ""}[row["met"]],
        )
    return table


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"
