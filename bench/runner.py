"""Run workloads repeatedly, summarise each metric, print a table and save JSON."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.databases import Scratch
from bench.workloads import Metrics, Sizes, Workload

# How the table shows a metric: its unit and its number format.  Metrics not
# listed are shown with a generic format under their own name.
_DISPLAY = {
    "jobs_per_s": ("jobs/s", "{:,.0f}"),
    "seconds": ("s", "{:,.3f}"),
}


@dataclass(frozen=True)
class Stats:
    """Median and range of one metric over the runs."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        """Summarise ``values``."""
        return cls(statistics.median(values), min(values), max(values))


@dataclass
class WorkloadResult:
    """Every run of one workload, and the summary of each metric."""

    name: str
    description: str
    runs: list[Metrics] = field(default_factory=list)

    @property
    def stats(self) -> dict[str, Stats]:
        """Summarise each metric over the runs, in the order the workload reported them."""
        names = list(dict.fromkeys(name for run in self.runs for name in run))
        return {name: Stats.of([run[name] for run in self.runs if name in run]) for name in names}


def run_workloads(
    backend: str,
    workloads: list[Workload],
    sizes: Sizes,
    scratch: Scratch,
    progress: Console,
) -> list[WorkloadResult]:
    """Run each workload ``sizes.runs`` times, each run on a fresh database."""
    results = []
    for workload in workloads:
        result = WorkloadResult(workload.name, workload.description)
        for number in range(1, sizes.runs + 1):
            with scratch.fresh() as url:
                metrics = workload.run(backend, url, sizes)
            result.runs.append(metrics)
            progress.print(
                f"[dim]{workload.name} run {number}/{sizes.runs}:[/] {_describe(metrics)}"
            )
        results.append(result)
    return results


def machine_info(scratch: Scratch) -> dict[str, Any]:
    """Describe the machine, interpreter, drivers and database the figures come from."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "psycopg": _version("psycopg"),
        "psycopg_pool": _version("psycopg-pool"),
        "conveyor": _version("conveyor"),
    }
    info.update(scratch.describe())
    return info


def render_table(
    backend: str, profile: str, results: list[WorkloadResult], info: dict[str, Any]
) -> Table:
    """Build the rich table of medians and ranges."""
    table = Table(title=f"conveyor bench: {backend}, {profile}")
    table.add_column("workload")
    table.add_column("metric")
    table.add_column("median", justify="right")
    table.add_column("min–max", justify="right")
    table.add_column("runs", justify="right")
    for result in results:
        for position, (metric, stats) in enumerate(result.stats.items()):
            unit, number = _DISPLAY.get(metric, (metric, "{:,.4g}"))
            table.add_row(
                result.name if position == 0 else "",
                unit,
                number.format(stats.median),
                f"{number.format(stats.min)} – {number.format(stats.max)}",
                str(len(result.runs)),
            )
        table.add_section()
    database = info.get("postgres_server_version") or info.get("sqlite_version")
    table.caption = (
        f"{info['date']} · {info['cores']} cores ({info['cpu']}) · Python {info['python']} · "
        f"{'PostgreSQL' if backend == 'postgres' else 'SQLite'} {database}"
    )
    return table


def report(
    backend: str,
    profile: str,
    sizes: Sizes,
    results: list[WorkloadResult],
    info: dict[str, Any],
) -> dict[str, Any]:
    """Build the JSON-serialisable report of a whole invocation."""
    return {
        "backend": backend,
        "profile": profile,
        "argv": sys.argv[1:],
        "sizes": asdict(sizes),
        "machine": info,
        "workloads": {
            result.name: {
                "description": result.description,
                "runs": result.runs,
                "stats": {metric: asdict(stats) for metric, stats in result.stats.items()},
            }
            for result in results
        },
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _describe(metrics: Metrics) -> str:
    """Format one run's metrics for the progress log."""
    parts = []
    for metric, value in metrics.items():
        unit, number = _DISPLAY.get(metric, (metric, "{:,.4g}"))
        parts.append(f"{number.format(value)} {unit}")
    return ", ".join(parts)


def _version(distribution: str) -> str | None:
    """Return the installed version of ``distribution``, or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo, or the platform's guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
