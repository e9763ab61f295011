"""Profile a conveyor worker while it drains: ``python -m bench.profile --backend sqlite``.

Submits ``--jobs`` no-op jobs to a scratch database, runs one burst worker under
``py-spy record`` (``pip install py-spy``), and prints where each of the worker's
threads spent its samples: the share of the run each thread was busy, and the
functions with the largest inclusive and self shares of the event loop's busy
samples.  ``--svg`` writes a flame graph from a second, identical drain.

py-spy samples only threads that are running (not waiting in ``select``, a lock
or a queue), so a thread's share of the samples is about its CPU utilisation.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import re
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import measure
from bench.databases import open_scratch
from bench.db import connect
from bench.procs import Workers

# What the benchmark's quiet drain turns off (bench.measure.drain_observed).
QUIET: tuple[tuple[str, ...], dict[str, str]] = (
    ("--no-metrics",),
    {"CONVEYOR_LOG_LEVEL": "WARNING"},
)

# A frame as py-spy writes it in raw (collapsed) output: "function (path/file.py:line)".
_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>[^():]*?)(?::\d+)?\)$")


@dataclass
class ThreadProfile:
    """The stacks sampled in one thread, with how often each was seen."""

    name: str
    samples: int = 0
    stacks: collections.Counter[tuple[str, ...]] = field(default_factory=collections.Counter)

    def inclusive(self) -> collections.Counter[str]:
        """Samples in which each function was on the stack (counted once per sample)."""
        counts: collections.Counter[str] = collections.Counter()
        for stack, count in self.stacks.items():
            for frame in set(stack):
                counts[frame] += count
        return counts

    def own(self) -> collections.Counter[str]:
        """Samples in which each function was the innermost Python frame."""
        counts: collections.Counter[str] = collections.Counter()
        for stack, count in self.stacks.items():
            counts[stack[-1]] += count
        return counts


def parse_raw(lines: Iterable[str]) -> dict[str, ThreadProfile]:
    """Read py-spy's raw output (``--format raw --threads``) into one profile per thread."""
    threads: dict[str, ThreadProfile] = {}
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack_text, _, count_text = line.rpartition(" ")
        frames = stack_text.split(";")
        # With --threads the first element names the thread: 'thread (0x7f..)' or a name.
        thread, frames = frames[0], frames[1:]
        if not frames:
            continue
        profile = threads.setdefault(thread, ThreadProfile(thread))
        count = int(count_text)
        profile.samples += count
        profile.stacks[tuple(_short(frame) for frame in frames)] += count
    return threads


def _short(frame: str) -> str:
    """``function (conveyor/worker.py)``: the frame without its line, the path shortened."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match.group("path")
    for marker in ("site-packages/", "lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker.startswith("lib/python3."):
                path = path.split("/", 1)[1] if "/" in path else path
    return f"{match.group('function')} ({path})"


def without_imports(threads: dict[str, ThreadProfile]) -> tuple[dict[str, ThreadProfile], int]:
    """Drop the samples taken while modules were imported (start-up); return how many."""
    kept: dict[str, ThreadProfile] = {}
    dropped = 0
    for name, profile in threads.items():
        clean = ThreadProfile(name)
        for stack, count in profile.stacks.items():
            if any(frame.startswith("_find_and_load ") for frame in stack):
                dropped += count
                continue
            clean.stacks[stack] += count
            clean.samples += count
        if clean.samples:
            kept[name] = clean
    return kept, dropped


def render(threads: dict[str, ThreadProfile], seconds: float, rate: int, top: int) -> list[Table]:
    """Tables: busy share per thread; conveyor's functions; the largest self shares."""
    threads, imports = without_imports(threads)
    expected = seconds * rate
    total = sum(t.samples for t in threads.values())
    overview = Table(
        title=f"threads: busy share of the {seconds:.2f} s drain, sampled at {rate}/s "
        f"({imports} start-up import samples left out)"
    )
    overview.add_column("thread")
    overview.add_column("samples", justify="right")
    overview.add_column("busy", justify="right")
    ordered = sorted(threads.values(), key=lambda t: t.samples, reverse=True)
    for profile in ordered:
        overview.add_row(
            profile.name, str(profile.samples), f"{100 * profile.samples / expected:.0f}%"
        )
    tables = [overview]

    # conveyor's own functions, over every thread: where the hot path spends its time.
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for profile in ordered:
        inclusive.update(profile.inclusive())
        own.update(profile.own())
    ours = Table(title=f"conveyor's functions: share of all {total} busy samples (every thread)")
    ours.add_column("function (file)")
    ours.add_column("inclusive", justify="right")
    ours.add_column("self", justify="right")
    # The CLI's frames hold the whole main thread: they are the trunk, not the hot path.
    trunk = ("(conveyor/cli/__init__.py)", "(conveyor/__main__.py)")
    mine = [
        (f, c) for f, c in inclusive.most_common() if "(conveyor/" in f and not f.endswith(trunk)
    ]
    for frame, count in mine[:top]:
        ours.add_row(frame, f"{100 * count / total:.1f}%", f"{100 * own[frame] / total:.1f}%")
    tables.append(ours)

    for profile in ordered[:2]:
        by_self = Table(title=f"{profile.name}: largest self shares of its {profile.samples}")
        by_self.add_column("function (file)")
        by_self.add_column("self", justify="right")
        by_self.add_column("inclusive", justify="right")
        mine_inclusive = profile.inclusive()
        for frame, count in profile.own().most_common(top):
            by_self.add_row(
                frame,
                f"{100 * count / profile.samples:.1f}%",
                f"{100 * mine_inclusive[frame] / profile.samples:.1f}%",
            )
        tables.append(by_self)
    return tables


def _drain_under_pyspy(
    backend: str,
    url: str,
    jobs: int,
    concurrency: int,
    rate: int,
    output: Path,
    fmt: str,
    quiet: bool = False,
) -> float:
    """Drain ``jobs`` no-op jobs with one worker run by py-spy; return the drain's seconds."""
    asyncio.run(measure._submit_noops(url, jobs))
    workers = Workers(url)
    with connect(backend, url) as db:
        measure._prepare(db)
        try:
            workers.start(
                concurrency=concurrency,
                burst=True,
                prefix=[
                    _pyspy(),
                    "record",
                    "--rate",
                    str(rate),
                    "--format",
                    fmt,
                    "--threads",
                    "--nonblocking",
                    "--output",
                    str(output),
                    "--",
                ],
                extra=QUIET[0] if quiet else (),
                env_extra=QUIET[1] if quiet else None,
            )
            workers.wait_all(600.0)
        finally:
            workers.close()
        finished = measure._finished_times(db)
        first = float(
            db.value(f"SELECT min({measure._epoch(backend, 'started_at')}) FROM conveyor_workers")
        )
    if len(finished) != jobs:
        raise RuntimeError(f"only {len(finished)} of {jobs} jobs succeeded")
    return finished[-1] - first


def _pyspy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile", description="Profile a conveyor worker while it drains."
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres"), required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument("--top", type=int, default=30, help="functions to list")
    parser.add_argument("--svg", action="store_true", help="also write a flame graph")
    parser.add_argument("--out", type=Path, help="directory for the profiles")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="as the benchmark's quiet drain: --no-metrics, log level WARNING",
    )
    args = parser.parse_args(argv)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path(__file__).parent / "results" / f"profile-{args.backend}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    console = Console(width=140)
    raw = out / "worker.txt"
    with open_scratch(args.backend) as scratch:
        with scratch.fresh() as url:
            seconds = _drain_under_pyspy(
                args.backend, url, args.jobs, args.concurrency, args.rate, raw, "raw", args.quiet
            )
        if args.svg:
            with scratch.fresh() as url:
                _drain_under_pyspy(
                    args.backend,
                    url,
                    args.jobs,
                    args.concurrency,
                    args.rate,
                    out / "worker.svg",
                    "flamegraph",
                    args.quiet,
                )
    console.print(
        f"{args.jobs:,} jobs drained in {seconds:.2f} s ({args.jobs / seconds:,.0f} jobs/s) "
        f"under py-spy, concurrency {args.concurrency}"
    )
    threads = parse_raw(raw.read_text().splitlines())
    for table in render(threads, seconds, args.rate, args.top):
        console.print(table)
    console.print(f"raw stacks: {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
