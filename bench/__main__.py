"""Command line: ``python -m bench --backend sqlite|postgres --quick|--full``."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import shutil
import signal
import sys
from pathlib import Path
from types import FrameType

import psycopg
from rich.console import Console

from bench import runner, targets
from bench.databases import POSTGRES_URL_ENV, open_scratch
from bench.workloads import BACKENDS, PROFILES, REGISTRY, Workload


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the chosen workloads and report them."""
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console(width=max(120, shutil.get_terminal_size().columns))
    if args.list:
        for workload in REGISTRY.values():
            console.print(f"[bold]{workload.name:<24}[/] {workload.description}")
        return 0
    if args.backend is None:
        parser.error("--backend is required")
    try:
        workloads = _select(args.only)
    except ValueError as error:
        parser.error(str(error))
    profile = "full" if args.full else "quick"
    sizes = PROFILES[profile]
    if args.runs is not None:
        sizes = dataclasses.replace(sizes, runs=args.runs)
    json_path = args.json or _default_json_path(args.backend, profile)

    # Turn SIGTERM into SystemExit so that the scratch databases are still dropped.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    progress = Console(stderr=True, soft_wrap=True)
    try:
        with open_scratch(args.backend) as scratch:
            info = runner.machine_info(scratch)
            results = runner.run_workloads(args.backend, workloads, sizes, scratch, progress)
    except psycopg.OperationalError as error:
        progress.print(f"[red]PostgreSQL: {error}[/]")
        progress.print(
            f"Point {POSTGRES_URL_ENV} at a server the benchmark may create databases on."
        )
        return 1
    console.print(runner.render_table(args.backend, profile, results, info))
    console.print(
        targets.render(args.backend, targets.compare(args.backend, runner.medians(results)))
    )
    runner.write_json(json_path, runner.report(args.backend, profile, sizes, results, info))
    progress.print(f"wrote {json_path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    """Build the argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark conveyor and the raw-SQL floor on SQLite or PostgreSQL.",
    )
    parser.add_argument("--backend", choices=BACKENDS, help="database to benchmark")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes, 3 runs (the default)")
    size.add_argument("--full", action="store_true", help="full sizes, 5 runs")
    parser.add_argument(
        "--runs", type=_at_least_three, help="override the number of runs (3 or more)"
    )
    parser.add_argument(
        "--only", metavar="WORKLOAD,...", help="comma-separated names or shell patterns"
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="write the JSON report to PATH (default: bench/results/)",
    )
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    return parser


def _select(only: str | None) -> list[Workload]:
    """Return the registered workloads matching the ``--only`` patterns, in registry order."""
    if only is None:
        return list(REGISTRY.values())
    patterns = [pattern.strip() for pattern in only.split(",") if pattern.strip()]
    for pattern in patterns:
        if not fnmatch.filter(REGISTRY, pattern):
            raise ValueError(f"no workload matches {pattern!r}; see --list")
    return [
        w for name, w in REGISTRY.items() if any(fnmatch.fnmatchcase(name, p) for p in patterns)
    ]


def _default_json_path(backend: str, profile: str) -> Path:
    """Return ``bench/results/<backend>-<profile>-<UTC time>.json``."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(__file__).parent / "results" / f"{backend}-{profile}-{stamp}.json"


def _at_least_three(text: str) -> int:
    """Parse a run count; fewer than three runs make no median worth reporting."""
    runs = int(text)
    if runs < 3:
        raise argparse.ArgumentTypeError("at least 3 runs")
    return runs


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """Exit through SystemExit so that cleanup code runs."""
    sys.exit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
