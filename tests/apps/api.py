"""Job types for the REST API tests, served by the API in the test process and run by real
worker processes (``conveyor worker tests.apps.api:app``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from conveyor import Conveyor, JobContext
from conveyor.core.auth import Principal


def own_account(principal: Principal, payload: dict[str, Any]) -> bool:
    """A tenant may only charge its own accounts, named ``tenant:...``."""
    return str(payload["account"]).startswith(f"{principal.tenant}:")


def build(url: str | None = None) -> Conveyor:
    app = Conveyor(url or os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///unused-api.db"))

    @app.job()
    async def add(ctx: JobContext, a: int, b: int) -> int:
        return a + b

    @app.job(max_attempts=1)
    async def explode(ctx: JobContext, message: str = "boom") -> None:
        raise RuntimeError(message)

    @app.job()
    async def nap(ctx: JobContext, seconds: float) -> str:
        for step in range(10):
            ctx.progress(step, 10, "napping")
            await asyncio.sleep(seconds / 10)
        return "rested"

    @app.job(authorize=own_account)
    async def charge(ctx: JobContext, account: str, cents: int) -> str:
        return f"charged {cents} to {account}"

    @app.job()
    async def fan_out(ctx: JobContext, n: int) -> str:
        for i in range(n):
            await ctx.spawn("add", {"a": i, "b": i})
        return "spawned"

    return app


app = build()
