"""Command line: ``python -m bench --backend sqlite|postgres --quick|--full``."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import signal
import sys
from pathlib import Path
from types import FrameType

from rich.console import Console

from bench import runner
from bench.databases import open_scratch
from bench.workloads import BACKENDS, PROFILES, REGISTRY, Workload


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the chosen workloads and report them."""
    args = _parser().parse_args(argv)
    console = Console()
    if args.list:
        for workload in REGISTRY.values():
            console.print(f"[bold]{workload.name}[/]  {workload.description}")
        return 0
    if args.backend is None:
        console.print("[red]--backend is required[/]")
        return 2

    try:
        workloads = _select(args.only)
    except ValueError as error:
        console.print(f"[red]{error}[/]")
        return 2
    profile = "full" if args.full else "quick"
    sizes = PROFILES[profile]
    if args.runs is not None:
        sizes = dataclasses.replace(sizes, runs=args.runs)

    # Turn SIGTERM into SystemExit so that the scratch databases are still dropped.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    progress = Console(stderr=True)
    with open_scratch(args.backend) as scratch:
        info = runner.machine_info(scratch)
        results = runner.run_workloads(args.backend, workloads, sizes, scratch, progress)
    console.print(runner.render_table(args.backend, profile, results, info))
    if args.json is not None:
        runner.write_json(args.json, runner.report(args.backend, profile, sizes, results, info))
        progress.print(f"wrote {args.json}")
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
    parser.add_argument("--runs", type=_at_least_three, help="override the number of runs (3 or more)")
    parser.add_argument("--only", metavar="WORKLOAD,...", help="comma-separated names or shell patterns")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
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
    return [w for name, w in REGISTRY.items() if any(fnmatch.fnmatchcase(name, p) for p in patterns)]


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
