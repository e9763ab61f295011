"""The chaos application: job types whose handlers write the out-of-band run log.

Each run writes ``start`` (with the checkpointed step it resumes from), ``ckpt`` before
each fenced checkpoint and ``step`` once the checkpoint was accepted, ``refused`` when a
checkpoint was refused (the lease was lost), ``cancelled`` when the worker cancelled it,
and ``end`` when the handler returns. The result and every checkpoint carry the run's
lease token, so the checker can tell from the database which run wrote them.

Workers import it as ``chaos.app:app``; ``CHAOS_CRON=1`` declares the every-second cron
schedule (only the cron scenario's workers do).
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import time
from typing import Any

from chaos import runlog
from conveyor import Conveyor, JobContext
from conveyor.errors import LeaseLost

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///chaos-unused.db"))

# Faults cost attempts (a killed run is a lost attempt): allow many, retry quickly.
RETRY: dict[str, Any] = {"max_attempts": 100, "backoff": ("10ms", "200ms")}
GLOBAL_LIMIT = 2
KEY_LIMIT = 1


def _log(ctx: JobContext, event: str, **extra: Any) -> None:
    runlog.write(
        event,
        j=ctx.id,
        t=ctx.job.type,
        a=ctx.attempt,
        k=ctx.job.lease_token,
        **extra,
    )


def _lease_left(ctx: JobContext) -> float | None:
    """Seconds the claim's lease had left when the handler began (negative: expired)."""
    expires = ctx.job.lease_expires_at
    return None if expires is None else round(expires.timestamp() - time.time(), 3)


async def _steps(ctx: JobContext, steps: int, period: float, every: int = 1) -> dict[str, Any]:
    """The body of every stepping job: sleep, checkpoint, log; resumable from its state.

    ``every``: checkpoint every that many steps (0: never). A step without a checkpoint
    logs ``beat``: the run is doing work (a side effect outside conveyor) with nothing to
    fence it but the worker cancelling it once its lease is lost.
    """
    token = ctx.job.lease_token
    first = int((ctx.state or {}).get("step", 0))
    _log(ctx, "start", step=first, lease_left=_lease_left(ctx))
    try:
        for step in range(first + 1, steps + 1):
            await asyncio.sleep(period)
            if not every or step % every:
                _log(ctx, "beat", step=step)
                continue
            _log(ctx, "ckpt", step=step)
            try:
                await ctx.checkpoint({"step": step, "token": token})
            except LeaseLost:
                _log(ctx, "refused", step=step)
                raise
            _log(ctx, "step", step=step)
    except asyncio.CancelledError:
        _log(ctx, "cancelled")
        raise
    _log(ctx, "end")
    return {"token": token, "pid": os.getpid(), "steps": steps}


@app.job(**RETRY)
async def work(
    ctx: JobContext, steps: int = 2, period: float = 0.05, every: int = 1
) -> dict[str, Any]:
    """A drain job: a few short steps, checkpointed every ``every`` steps (0: never)."""
    return await _steps(ctx, steps, period, every)


@app.job(**RETRY)
async def blocker(
    ctx: JobContext, seconds: float, steps: int = 2, every: int = 1
) -> dict[str, Any]:
    """Holds the event loop with ``time.sleep`` (a CPU-bound async handler), then steps."""
    _log(ctx, "begin")
    _log(ctx, "block", seconds=seconds)
    time.sleep(seconds)
    _log(ctx, "unblock")
    return await _steps(ctx, steps, 0.05, every)


@app.job(**RETRY)
def sync_work(ctx: JobContext, steps: int = 4, period: float = 0.1) -> dict[str, Any]:
    """A sync handler (thread pool) with checkpoints; watches ctx.cancelled."""
    token = ctx.job.lease_token
    first = int((ctx.state or {}).get("step", 0))
    _log(ctx, "start", step=first)
    for step in range(first + 1, steps + 1):
        deadline = time.monotonic() + period
        while time.monotonic() < deadline:
            if ctx.cancelled:
                _log(ctx, "cancelled")
                ctx.raise_if_cancelled()
            time.sleep(0.01)
        _log(ctx, "ckpt", step=step)
        try:
            ctx.checkpoint_sync({"step": step, "token": token})
        except LeaseLost:
            _log(ctx, "refused", step=step)
            raise
        _log(ctx, "step", step=step)
    _log(ctx, "end")
    return {"token": token, "pid": os.getpid(), "steps": steps}


# Limited types only where the scenario wants them (CHAOS_LIMITS=0 leaves them out): a
# worker whose app has any limited type claims through the serialised, limit-counting
# path, and the other scenarios should exercise the plain claim.
if os.environ.get("CHAOS_LIMITS", "1") == "1":

    @app.job(global_concurrency=GLOBAL_LIMIT, **RETRY)
    async def limited(ctx: JobContext, steps: int = 3, period: float = 0.05) -> dict[str, Any]:
        """At most GLOBAL_LIMIT running across the cluster."""
        return await _steps(ctx, steps, period)

    @app.job(key_concurrency=KEY_LIMIT, **RETRY)
    async def keyed(ctx: JobContext, steps: int = 3, period: float = 0.05) -> dict[str, Any]:
        """At most KEY_LIMIT running per concurrency key."""
        return await _steps(ctx, steps, period)


@app.job(queue="ticks", **RETRY)
async def tick(ctx: JobContext) -> dict[str, Any]:
    """The cron schedule's job."""
    _log(ctx, "start", step=0)
    _log(ctx, "end")
    return {"token": ctx.job.lease_token}


# -- process isolation: each run logs from the child (its own pid) -------------------------


@app.job(isolation="process", max_attempts=1)
def iso_ok(ctx: JobContext, n: int = 20000) -> dict[str, Any]:
    _log(ctx, "start", step=0, child=True)
    total = sum(i * i for i in range(n))
    ctx.checkpoint_sync({"step": 1, "token": ctx.job.lease_token})
    _log(ctx, "end")
    return {"token": ctx.job.lease_token, "total": total}


@app.job(isolation="process", max_attempts=1)
def iso_abort(ctx: JobContext) -> None:
    _log(ctx, "start", step=0, child=True)
    os.abort()


@app.job(isolation="process", max_attempts=1)
def iso_segv(ctx: JobContext) -> None:
    _log(ctx, "start", step=0, child=True)
    os.kill(os.getpid(), signal.SIGSEGV)


@app.job(isolation="process", max_attempts=1)
def iso_oom(ctx: JobContext, limit_mb: int = 300) -> None:
    _log(ctx, "start", step=0, child=True)
    limit = limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    hoard = []
    while True:
        hoard.append(bytearray(16 * 1024 * 1024))


@app.job(isolation="process", max_attempts=1, timeout="1s")
def iso_hang(ctx: JobContext) -> None:
    _log(ctx, "start", step=0, child=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops it
    while True:
        time.sleep(0.05)


if os.environ.get("CHAOS_CRON") == "1":
    app.schedule("chaos-tick", "* * * * * *", tick)
