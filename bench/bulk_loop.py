"""The peer harness's bulk enqueue, in-process: ``python -m bench.bulk_loop``.

On a fresh PostgreSQL database (``CONVEYOR_BENCH_POSTGRES_URL``, as for ``python -m
bench``), submits ``--jobs`` jobs as the shared peer bench's ``enqueue_bulk`` does
(``app.submit_many`` of 1,000 ``Submission("noop", {"t": time.time()})`` a call, the
handler ``noop(ctx, t: float)``), ``--runs`` times on an emptied table, and prints each
run's throughput and this process's CPU per job, then their medians. ``--gc-stats``
also prints the cyclic garbage collector's collections and their time over all runs.
For A/B, run it from two checkouts alternately (docs/performance.md, "PostgreSQL, issue
31").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

import psycopg

from bench.databases import open_scratch
from conveyor import Conveyor, JobContext, Submission

CALL = 1000


async def measure(url: str, jobs: int, runs: int) -> list[tuple[float, float]]:
    """(jobs/s, process CPU µs per job) of each run."""
    app = Conveyor(url)

    @app.job(name="noop", max_attempts=3)
    async def noop(ctx: JobContext, t: float) -> None: ...

    figures = []
    try:
        await app.migrate()
        await app.submit_many([Submission("noop", {"t": 0.0})] * CALL)  # opens what it opens
        for _ in range(runs):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("TRUNCATE conveyor_jobs CASCADE")
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(jobs // CALL):
                await app.submit_many([Submission("noop", {"t": time.time()}) for _ in range(CALL)])
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            done = jobs // CALL * CALL
            figures.append((done / wall, cpu / done * 1e6))
    finally:
        await app.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk_loop", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gc-stats", action="store_true")
    args = parser.parse_args()
    if args.jobs < CALL:
        parser.error(f"--jobs must be at least {CALL} (one call)")
    collections: dict[int, list[float]] = {}
    started: list[float] = []

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            collections.setdefault(info["generation"], []).append(time.perf_counter() - started[0])

    if args.gc_stats:
        gc.callbacks.append(watch)
    with open_scratch("postgres") as scratch, scratch.fresh() as url:
        figures = asyncio.run(measure(url, args.jobs, args.runs))
    for rate, cpu in figures:
        print(f"{rate:9,.0f} jobs/s  CPU {cpu:5.2f} µs/job")
    rate = statistics.median(r for r, _ in figures)
    cpu = statistics.median(c for _, c in figures)
    print(f"median {rate:,.0f} jobs/s, CPU {cpu:.2f} µs/job")
    for generation, times in sorted(collections.items()):
        print(f"gc generation {generation}: {len(times)} collections, {sum(times):.3f} s")


if __name__ == "__main__":
    main()
