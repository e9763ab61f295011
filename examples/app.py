"""An example application: a fast job, a slow job that reports progress, a flaky job that
succeeds on a retry, a job that always fails, a video-like job that checkpoints so a
crash resumes where it was, and a bulk import that fans out to children and fans in.

Run it with ``conveyor demo examples.app:app`` (what ``scripts/demo`` does), or::

    conveyor worker examples.app:app
    conveyor submit add --app examples.app:app --payload '{"a": 2, "b": 3}' --wait
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

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


@app.job(timeout="1h", lease="30s")
async def transcode(ctx: JobContext, path: str, frames: int = 120) -> dict[str, object]:
    """A video-like job: progress every frame, a checkpoint every 20 frames.

    Kill its worker and another worker resumes it from the last checkpoint.
    """
    start = (ctx.state or {}).get("frame", 0)
    for frame in range(start, frames):
        await asyncio.sleep(0.03)  # "encode" one frame
        ctx.progress(frame + 1, frames, f"frame {frame + 1}/{frames}")
        if (frame + 1) % 20 == 0:
            await ctx.checkpoint({"frame": frame + 1})
    ctx.result_ref = f"{path}.mp4"
    return {"output": f"{path}.mp4", "resumed_from": start}


@app.job()
async def import_rows(ctx: JobContext, rows: int, chunk: int = 250) -> str:
    """A bulk job: one child per chunk of rows; a callback sums them up when all have ended.

    The parent is ``waiting`` until every child has ended, then ``succeeded`` if every
    chunk succeeded (a chunk retried to success counts), else ``failed``.
    """
    chunks = [
        Submission("import_chunk", {"start": s, "stop": min(s + chunk, rows)}, id=f"{ctx.id}.{s}")
        for s in range(0, rows, chunk)
    ]
    await ctx.spawn_many(chunks, on_complete=Submission("summarize_import", {"rows": rows}))
    return f"{len(chunks)} chunks"


@app.job(max_attempts=3, backoff="1s")
async def import_chunk(ctx: JobContext, start: int, stop: int) -> int:
    await asyncio.sleep(0.2)
    return stop - start


@app.job()
async def summarize_import(ctx: JobContext, rows: int, batch: dict[str, Any]) -> dict[str, Any]:
    """Fan-in, as a completion callback: runs once the batch has ended, whatever the
    outcome, with its counts in ``batch``."""
    return {"rows": rows, "chunks": batch["total"], "failed": batch["failed"] + batch["cancelled"]}


async def seed(app: Conveyor) -> list[JobHandle]:
    """Submit one of each, and a few fast ones, for ``conveyor demo``."""
    return await app.submit_many(
        [
            *(Submission("add", {"a": i, "b": i * i}) for i in range(4)),
            Submission("resize_images", {"count": 20}),
            Submission("flaky_upload", {"name": "report.pdf"}),
            Submission("always_fails", {}),
            Submission("transcode", {"path": "holiday.mov", "frames": 60}),
            Submission("import_rows", {"rows": 1000}),
        ]
    )
