"""Job types for the observability process test: some succeed, some retry, some fail."""

from __future__ import annotations

import asyncio
import os

from conveyor import Conveyor, JobContext

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///conveyor-test-unused.db"))


@app.job()
async def steady(ctx: JobContext, i: int) -> int:
    ctx.log.debug("steady %d", i)
    # A little time each, so that no one worker drains them all before the others' first
    # claims on a loaded machine (SQLite's write lock favours the worker that just wrote).
    await asyncio.sleep(0.02)
    return i


@app.job(max_attempts=3, backoff=("10ms", "10ms"), queue="flaky")
async def flaky(ctx: JobContext, i: int) -> int:
    if ctx.attempt == 1:
        raise ConnectionError(f"flaky {i} on its first attempt")
    return i


@app.job(max_attempts=2, backoff=("10ms", "10ms"))
def doomed(ctx: JobContext, i: int) -> None:
    raise ValueError(f"doomed {i}")
