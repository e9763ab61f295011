"""What one submit costs, layer by layer: ``python -m bench.submit_costs --backend sqlite``.

On a fresh database of ``--backend``, submits ``--jobs`` jobs in each of these ways,
interleaved, ``--rounds`` times, and prints the wall time and the CPU time of this
process per job (median and range over the rounds; on SQLite that includes the store's
thread and SQLite's own work, on PostgreSQL it is the client's alone):

- ``app.submit``: the public call, one job per call, awaited one at a time;
- ``store.submit``: the store's part of it alone (the jobs validated beforehand), so the
  difference is what the client layer adds (payload check, defaults, id, handle);
- ``app.submit_many``: calls of 1,000 jobs;
- on SQLite, ``empty write``: a write that does nothing, through the store's writer
  (``BEGIN IMMEDIATE``, ``COMMIT``, and the hand-off to the store's thread and back),
  and ``thread round trip``: a no-op run on the store's thread with
  ``loop.run_in_executor``, the hand-off alone.

Needs PostgreSQL for ``--backend postgres`` (``CONVEYOR_BENCH_POSTGRES_URL``, as for
``python -m bench``). The CPU figures depend less on the disk and the neighbours than
the wall times: on a busy machine, compare those.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.table import Table

from bench.app import build
from bench.databases import open_scratch
from bench.runner import Stats
from conveyor import Submission
from conveyor.core.ids import new_id

BULK = 1000
Runs = dict[str, list[tuple[float, float]]]  # way: (wall, CPU) µs per job, a round each
PAYLOAD = {"seconds": 0.0}  # the "sleep" type's: one float argument, checked by pydantic


async def _timed(jobs: int, run: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(wall µs, process CPU µs) per job of one call of ``run`` that handles ``jobs`` jobs."""
    wall, cpu = time.perf_counter(), time.process_time()
    await run()
    return (
        (time.perf_counter() - wall) / jobs * 1e6,
        (time.process_time() - cpu) / jobs * 1e6,
    )


async def measure(url: str, backend: str, jobs: int, rounds: int) -> Runs:
    app = build(url)
    try:
        store = await app.store()
        await app.submit("sleep", PAYLOAD)  # opens what a first submit opens
        template = app.prepare([Submission("sleep", PAYLOAD)])[0]
        loop = asyncio.get_running_loop()
        figures: Runs = {}

        async def each() -> None:
            for _ in range(jobs):
                await app.submit("sleep", PAYLOAD)

        async def store_only() -> None:
            for job in prepared:
                await store.submit([job])

        async def bulk() -> None:
            for _ in range(jobs // BULK):
                await app.submit_many([Submission("sleep", PAYLOAD)] * BULK)

        ways: dict[str, tuple[int, Callable[[], Awaitable[None]]]] = {
            "app.submit": (jobs, each),
            "store.submit": (jobs, store_only),
            f"app.submit_many, {BULK} a call": (jobs // BULK * BULK, bulk),
        }
        if backend == "sqlite":
            writer, executor = store._writer, store._executor  # type: ignore[attr-defined]

            async def empty() -> None:
                for _ in range(jobs):
                    await writer.write(lambda conn: None)

            async def round_trip() -> None:
                for _ in range(jobs):
                    await loop.run_in_executor(executor, int)

            ways["empty write"] = (jobs, empty)
            ways["thread round trip"] = (jobs, round_trip)
        for _ in range(rounds):
            prepared = [dataclasses.replace(template, id=new_id(time.time())) for _ in range(jobs)]
            for name, (count, run) in ways.items():
                figures.setdefault(name, []).append(await _timed(count, run))
        return figures
    finally:
        await app.close()


def _cell(values: list[float]) -> str:
    stats = Stats.of(values)
    return f"{stats.median:,.1f} ({stats.min:,.1f}–{stats.max:,.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.submit_costs", description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per way and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.jobs < BULK:
        parser.error(f"--jobs must be at least {BULK} (one bulk call)")
    with open_scratch(args.backend) as scratch, scratch.fresh() as url:
        figures = asyncio.run(measure(url, args.backend, args.jobs, args.rounds))
    title = f"one submit on {args.backend}: µs per job, median (range) of {args.rounds} rounds"
    table = Table(title=title)
    table.add_column("way")
    table.add_column("wall µs/job", justify="right")
    table.add_column("process CPU µs/job", justify="right")
    for name, runs in figures.items():
        table.add_row(name, _cell([w for w, _ in runs]), _cell([c for _, c in runs]))
    Console().print(table)


if __name__ == "__main__":
    main()
