"""Job types for the dashboard tests: a crawl that reports progress, a failure, a fan-out
of children, and a job type whose name is markup."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from conveyor import Conveyor, JobContext
from conveyor.app.handles import Submission

MARKUP_TYPE = '<script>alert("type")</script>'


def build(url: str | None = None) -> Conveyor:
    app = Conveyor(url or os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///unused-ui.db"))

    @app.job()
    async def add(ctx: JobContext, a: int, b: int) -> int:
        return a + b

    @app.job(max_attempts=1)
    async def explode(ctx: JobContext, message: str = "boom") -> None:
        raise RuntimeError(message)

    @app.job(queue="slow")
    async def crawl(ctx: JobContext, steps: int, pause: float = 0.2) -> dict[str, int]:
        for step in range(steps):
            ctx.progress(step, steps, f"page {step} of {steps}")
            await asyncio.sleep(pause)
        return {"pages": steps}

    @app.job()
    async def fan_out(
        ctx: JobContext, n: int, pause: float = 0.0, fail: int = 0, callback: bool = False
    ) -> str:
        subs = [
            Submission(type="explode", payload={}, id=f"{ctx.id}.{i}")
            if i < fail
            else Submission(type="nap", payload={"seconds": pause}, id=f"{ctx.id}.{i}")
            for i in range(n)
        ]
        await ctx.spawn_many(subs, on_complete="batch_done" if callback else None)
        return "spawned"

    @app.job()
    async def batch_done(ctx: JobContext, batch: dict[str, Any]) -> int:
        return int(batch["done"])

    @app.job()
    async def nap(ctx: JobContext, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "rested"

    async def markup(ctx: JobContext) -> str:
        return "<b>result</b>"

    app.job(name=MARKUP_TYPE, max_attempts=1)(markup)

    app.schedule("nightly", "0 3 * * *", "add", {"a": 1, "b": 2})
    app.schedule("hourly", "0 * * * *", "add", {"a": 2, "b": 3}, overlap="skip")
    return app


app = build()
