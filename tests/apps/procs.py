"""Job types for tests that run real worker processes.

Each handler run is recorded outside the database under test: one line appended to the
file named by CONVEYOR_TEST_RECORD (small O_APPEND writes do not interleave).
"""

from __future__ import annotations

import asyncio
import os
import time

from conveyor import Conveyor, JobContext, Submission

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///conveyor-test-unused.db"))


def record(ctx: JobContext, event: str) -> None:
    path = os.environ["CONVEYOR_TEST_RECORD"]
    line = f"{event} {ctx.id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.job()
async def noop(ctx: JobContext, i: int) -> int:
    record(ctx, "run")
    return i


@app.job(max_attempts=3, backoff="100ms")
async def sleepy(ctx: JobContext, seconds: float) -> dict[str, int]:
    record(ctx, "start")
    await asyncio.sleep(seconds)
    record(ctx, "end")
    return {"pid": os.getpid()}


@app.job(max_attempts=3, backoff="100ms")
def sync_sleepy(ctx: JobContext, seconds: float) -> dict[str, int]:
    record(ctx, "start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.raise_if_cancelled()
        time.sleep(0.01)
    record(ctx, "end")
    return {"pid": os.getpid()}


@app.job(max_attempts=3, backoff="100ms")
async def video(ctx: JobContext, frames: int) -> dict[str, int]:
    """A video-like job: progress every frame, a checkpoint every 10 frames."""
    start = (ctx.state or {}).get("frame", 0)
    record(ctx, f"resume@{start}")
    for frame in range(start, frames):
        await asyncio.sleep(0.02)
        ctx.progress(frame + 1, frames)
        if (frame + 1) % 10 == 0:
            await ctx.checkpoint({"frame": frame + 1})
    return {"frames": frames, "resumed_from": start}


@app.job(global_concurrency=2)
async def limited(ctx: JobContext) -> None:
    record(ctx, "start")
    await asyncio.sleep(0.1)
    record(ctx, "end")


@app.job(global_concurrency=1, max_attempts=5, backoff="100ms")
async def singleton(ctx: JobContext, seconds: float) -> int:
    record(ctx, "start")
    await asyncio.sleep(seconds)
    return os.getpid()


@app.job(rate_limit="20/s")
async def rated(ctx: JobContext) -> None:
    record(ctx, "start")


@app.job()
async def unlimited(ctx: JobContext) -> None:
    record(ctx, "start")


@app.job()
async def fanout(ctx: JobContext, n: int) -> int:
    """A bulk job: one child per item, spawned in one write."""
    await ctx.spawn_many([Submission("item", {"i": i}, id=f"{ctx.id}.{i}") for i in range(n)])
    return n


@app.job()
async def item(ctx: JobContext, i: int) -> int:
    return i


@app.job()
async def held_batch(ctx: JobContext, running: int, held: int) -> None:
    """A parent of ``running`` long children and ``held`` ones in the paused queue ``held``."""
    await ctx.spawn_many(
        [Submission("sleepy", {"seconds": 120}, id=f"{ctx.id}.{i}") for i in range(running)]
        + [
            Submission("sleepy", {"seconds": 120}, id=f"{ctx.id}.{running + i}", queue="held")
            for i in range(held)
        ],
        on_complete="batch_seen",
    )


@app.job()
async def batch_seen(ctx: JobContext, batch: dict[str, object]) -> dict[str, object]:
    """A completion callback that returns the batch it was given."""
    return batch
