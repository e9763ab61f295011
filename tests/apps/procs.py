"""Job types for tests that run real worker processes.

Each handler run is recorded outside the database under test: one line appended to the
file named by CONVEYOR_TEST_RECORD (small O_APPEND writes do not interleave).
"""

from __future__ import annotations

import asyncio
import os
import time

from conveyor import Conveyor, JobContext

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
