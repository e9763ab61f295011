"""Process-isolated job types; they must live at module level so a child can import them."""

from __future__ import annotations

import os
import resource
import signal
import time

from conveyor import Conveyor, JobContext

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///conveyor-test-unused.db"))


@app.job(isolation="process", max_attempts=1)
def crunch(ctx: JobContext, n: int) -> dict[str, int]:
    """CPU-bound work with progress and a checkpoint, in a child process."""
    total = 0
    for i in range(n):
        total += i * i
        ctx.progress(i + 1, n)
    ctx.checkpoint_sync({"done": n})
    return {"total": total, "pid": os.getpid()}


@app.job(isolation="process", max_attempts=1)
async def crunch_async(ctx: JobContext, n: int) -> int:
    await ctx.checkpoint({"started": True})
    return sum(range(n))


@app.job(isolation="process", max_attempts=1)
def exits(ctx: JobContext) -> None:
    os._exit(1)


@app.job(isolation="process", max_attempts=1)
def segfaults(ctx: JobContext) -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


@app.job(isolation="process", max_attempts=1)
def hogs_memory(ctx: JobContext, limit_mb: int) -> None:
    limit = limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    hoard = []
    while True:
        hoard.append(bytearray(10 * 1024 * 1024))


@app.job(isolation="process", max_attempts=1)
def ignores_cancel(ctx: JobContext) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL will stop it
    while True:
        time.sleep(0.05)


@app.job(isolation="process", max_attempts=2, timeout="500ms", backoff="10ms")
def hangs_first(ctx: JobContext) -> str:
    if ctx.attempt == 1:
        while True:
            time.sleep(0.05)
    return "second attempt"
