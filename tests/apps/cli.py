"""Job types for the CLI's tests (tests/test_cli.py)."""

from __future__ import annotations

import asyncio
import os

from conveyor import Conveyor, JobContext, Submission

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///conveyor-test-unused.db"))


@app.job()
async def build_report(ctx: JobContext, months: int) -> int:
    return months


@app.job(max_attempts=1)
def explode(ctx: JobContext, why: str) -> None:
    raise ValueError(f"exploded: {why}")


@app.job()
async def sleepy(ctx: JobContext) -> None:
    ctx.progress(0, 1, "sleeping until cancelled")
    await asyncio.sleep(3600)


@app.job(max_attempts=1)
async def part(ctx: JobContext, fail: bool) -> None:
    if fail:
        raise RuntimeError("this part is broken")


@app.job()
async def parts(ctx: JobContext, n: int) -> None:
    await ctx.spawn_many(
        [Submission("part", {"fail": i == 0}, id=f"{ctx.id}.{i}") for i in range(n)]
    )
