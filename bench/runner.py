"""Run workloads repeatedly, summarise each metric, print a table and save JSON."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import targets
from bench.databases import Scratch
from bench.targets import Medians
from bench.workloads import Metrics, Sizes, Workload

# How the table shows a metric: its unit and its number format.  Metrics not
# listed are shown with a generic format under their own name.
_DISPLAY = {
    "jobs_per_s": ("jobs/s", "{:,.0f}"),
    "steady_jobs_per_s": ("jobs/s, 10–90%", "{:,.0f}"),
    "seconds": ("s", "{:,.3f}"),
    "jobs_per_claim": ("jobs per claim", "{:,.1f}"),
    "jobs_per_settle": ("jobs per settle", "{:,.1f}"),
    "worker_cpu_us_per_job": ("worker CPU µs/job", "{:,.0f}"),
    "server_cpu_us_per_job": ("server CPU µs/job", "{:,.0f}"),
    "p50_ms": ("p50 ms", "{:,.2f}"),
    "p95_ms": ("p95 ms", "{:,.2f}"),
    "p99_ms": ("p99 ms", "{:,.2f}"),
    "max_ms": ("max ms", "{:,.2f}"),
    "worker_cpu_pct": ("worker CPU %", "{:,.1f}"),
    "rss_mb": ("RSS MB", "{:,.1f}"),
    "idle_rss_mb": ("RSS MB, idle", "{:,.1f}"),
    "statements_per_s": ("statements/s", "{:,.1f}"),
    "commits_per_s": ("WAL syncs/s", "{:,.1f}"),
    "call_us": ("µs per call", "{:,.2f}"),
    "handler_s": ("handler s", "{:,.3f}"),
    "progress_writes": ("progress writes", "{:,.0f}"),
    "spawn_s": ("spawn s", "{:,.3f}"),
    "rows_loaded": ("rows in table", "{:,.0f}"),
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
    error: str | None = None  # why the workload stopped early, if it failed

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
        runs = min(sizes.runs, workload.max_runs or sizes.runs)
        for number in range(1, runs + 1):
            try:
                with scratch.fresh() as url:
                    metrics = workload.run(backend, url, sizes)
            except Exception as error:
                # One broken workload must not cost the figures of all the others: it is
                # reported as failed, with its reason, and the run goes on.
                result.error = f"run {number}: {type(error).__name__}: {error}"
                progress.print(f"[red]{workload.name} failed in {result.error}[/]")
                break
            result.runs.append(metrics)
            progress.print(f"[dim]{workload.name} run {number}/{runs}:[/] {_describe(metrics)}")
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
        "conveyor_source": _source(),
        # Anything else running on the machine shows in the figures: say how busy it was.
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }
    info.update(scratch.describe())
    return info


def render_table(
    backend: str, profile: str, results: list[WorkloadResult], info: dict[str, Any]
) -> Table:
    """Build the rich table of medians and ranges."""
    table = Table(title=f"conveyor bench: {backend}, {profile}")
    table.add_column("workload", no_wrap=True)
    table.add_column("metric", no_wrap=True)
    table.add_column("median", justify="right")
    table.add_column("min–max", justify="right")
    table.add_column("runs", justify="right")
    for result in results:
        if result.error is not None:
            reason = result.error.splitlines()[0]
            table.add_row(result.name, "[red]failed[/]", "", reason[:60], str(len(result.runs)))
        for position, (metric, stats) in enumerate(result.stats.items()):
            unit, number = _DISPLAY.get(metric, (metric, "{:,.4g}"))
            table.add_row(
                result.name if position == 0 and result.error is None else "",
                unit,
                number.format(stats.median),
                f"{number.format(stats.min)} – {number.format(stats.max)}",
                str(len(result.runs)),
            )
        table.add_section()
    database = info.get("postgres_server_version") or info.get("sqlite_version")
    table.caption = (
        f"{info['date']} · {info['cores']} cores ({info['cpu']}) · Python {info['python']} · "
        f"{'PostgreSQL' if backend == 'postgres' else 'SQLite'} {database} · "
        f"load average {info.get('load_average_at_start', '?')} at start, "
        f"{os.getloadavg()[0]:.2f} at end"
    )
    return table


def medians(results: list[WorkloadResult]) -> Medians:
    """The median of every metric of every workload, keyed by (workload, metric)."""
    return {
        (result.name, metric): stats.median
        for result in results
        for metric, stats in result.stats.items()
    }


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
                "error": result.error,
                "runs": result.runs,
                "stats": {metric: asdict(stats) for metric, stats in result.stats.items()},
            }
            for result in results
        },
        "comparisons": targets.compare(backend, medians(results)),
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


def _source() -> str:
    """Where conveyor was imported from, with its git commit and whether it had local edits."""
    import conveyor

    folder = Path(conveyor.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(folder)
    return f"{folder} @ {commit}{' with local changes' if dirty else ''}"


def _cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo, or the platform's guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
