"""An example application: a fast job, a slow job that reports progress, a flaky job that
succeeds on a retry and a job that always fails.

Run it with ``conveyor demo examples.app:app`` (what ``scripts/demo`` does), or::

    conveyor worker examples.app:app
    conveyor submit add --app examples.app:app --payload '{"a": 2, "b": 3}' --wait
"""

from __future__ import annotations

import asyncio
import os

from conveyor import Conveyor, JobContext, JobHandle, Submission

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///demo.db"))


@app.job()
async def add(ctx: JobContext, a: int, b: int) -> int:
    """A fast job."""
    return a + b


@app.job(timeout="5m")
async def resize_images(ctx: JobContext, count: int = 20) -> dict[str, int]:
    """A slow job that reports progress as it goes and its tally in its result."""
    for i in range(count):
        await asyncio.sleep(0.15)
        await ctx.progress(i + 1, count, f"image {i + 1} of {count}")
    return {"resized": count}


@app.job(max_attempts=4, backoff=("1s", "10s"))
async def flaky_upload(ctx: JobContext, name: str, fails: int = 2) -> str:
    """Fails its first ``fails`` attempts, then succeeds: retries with backoff at work."""
    await asyncio.sleep(0.3)
    if ctx.attempt <= fails:
        raise ConnectionError(f"upload of {name} failed (attempt {ctx.attempt})")
    return f"uploaded {name} on attempt {ctx.attempt}"


@app.job(max_attempts=2, backoff="1s")
def always_fails(ctx: JobContext, reason: str = "the printer is on fire") -> None:
    """A sync handler that always fails: it ends ``failed`` after its attempts."""
    raise RuntimeError(reason)


async def seed(app: Conveyor) -> list[JobHandle]:
    """Submit one of each, and a few fast ones, for ``conveyor demo``."""
    return await app.submit_many(
        [
            *(Submission("add", {"a": i, "b": i * i}) for i in range(4)),
            Submission("resize_images", {"count": 20}),
            Submission("flaky_upload", {"name": "report.pdf"}),
            Submission("always_fails", {}),
        ]
    )
