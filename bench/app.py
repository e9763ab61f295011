"""The benchmark's job types, in a Conveyor app that worker processes import.

Workers run as ``python -m conveyor worker bench.app:app ...`` with
``CONVEYOR_DATABASE_URL`` pointing at the run's scratch database; the benchmark
process itself builds the same job types on its own URL with :func:`build`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from conveyor import Conveyor, JobContext, Submission


def submit_only(path: Path) -> Conveyor:
    """An app on the SQLite file ``path`` with the peer harness's job type, ``noop(t:
    float)``, for benchmarks that only submit (``bench.index_cost``,
    ``bench.submit_layers``): its jobs are never run."""
    app = Conveyor(f"sqlite:///{path}")

    @app.job(name="noop", max_attempts=3)
    async def noop(ctx: JobContext, t: float) -> None:
        """Never run: the benchmark only submits."""

    return app


def build(url: str | None = None) -> Conveyor:
    """Return an app with the benchmark's job types on ``url`` (default: from the environment)."""
    app = Conveyor(url)

    @app.job(name="noop")
    async def noop(ctx: JobContext) -> None:
        """Do nothing: the drain and latency workloads measure conveyor, not the handler."""

    @app.job(name="sleep")
    async def sleep(ctx: JobContext, seconds: float) -> None:
        """Hold a slot without using the CPU, so that heartbeats have leases to renew."""
        await asyncio.sleep(seconds)

    @app.job(name="progress")
    async def progress(ctx: JobContext, calls: int, pauses: int, pause: float) -> dict[str, float]:
        """Call ``ctx.progress`` ``calls`` times, yielding ``pauses`` times for ``pause`` seconds.

        Returns the seconds spent inside ``ctx.progress`` and in the whole handler, so
        that the cost of the call can be told apart from the pauses.
        """
        every = max(1, calls // max(1, pauses))
        in_calls = 0.0
        start = time.perf_counter()
        for done in range(1, calls + 1):
            before = time.perf_counter()
            ctx.progress(done, calls)
            in_calls += time.perf_counter() - before
            if pauses and done % every == 0:
                await asyncio.sleep(pause)
        return {"in_calls_s": in_calls, "handler_s": time.perf_counter() - start}

    @app.job(name="tree")
    async def tree(ctx: JobContext, children: int) -> dict[str, float]:
        """Spawn ``children`` no-op children in one fenced write; the job ends with them."""
        start = time.perf_counter()
        await ctx.spawn_many([Submission("noop", {}, id=f"{ctx.id}.{n}") for n in range(children)])
        return {"spawn_s": time.perf_counter() - start}

    return app


app = build()
