"""Callbacks around each attempt: started, ended (recorded), and final failure."""

from __future__ import annotations

import logging

import pytest

from conveyor import Conveyor, JobContext, Status
from conveyor.observe.hooks import AttemptEnded, AttemptStarted
from tests.helpers import running_worker, settled


async def test_hooks_hear_each_attempt_and_the_final_failure(app: Conveyor) -> None:
    started: list[AttemptStarted] = []
    ended: list[AttemptEnded] = []
    final: list[AttemptEnded] = []
    app.on_attempt_start(started.append)
    app.on_attempt_end(ended.append)
    app.on_final_failure(final.append)

    @app.job(max_attempts=2, backoff=("10ms", "10ms"))
    async def flaky(ctx: JobContext) -> None:
        raise ValueError(f"boom {ctx.attempt}")

    @app.job()
    async def fine(ctx: JobContext) -> int:
        return 1

    bad, good = await flaky.submit(), await fine.submit()
    async with running_worker(app) as worker:
        await settled(bad, Status.FAILED)
        await settled(good, Status.SUCCEEDED)
    assert sorted((e.job.type, e.job.attempt) for e in started) == [
        ("fine", 1),
        ("flaky", 1),
        ("flaky", 2),
    ]
    assert all(e.worker_id == worker.id for e in started + ended)
    by_job = {(e.job.id, e.job.attempt): e for e in ended}
    retried, failed, succeeded = by_job[bad.id, 1], by_job[bad.id, 2], by_job[good.id, 1]
    assert (retried.status, retried.outcome, retried.error) == (
        "queued",
        "failed",
        "ValueError: boom 1",
    )
    assert retried.retry_at is not None
    assert (failed.status, failed.outcome) == ("failed", "failed")
    assert failed.traceback and "ValueError: boom 2" in failed.traceback
    assert (succeeded.status, succeeded.outcome) == ("succeeded", "succeeded")
    assert succeeded.duration >= 0
    assert [e.job.id for e in final] == [bad.id]


async def test_a_hook_that_raises_is_logged_and_the_worker_carries_on(
    app: Conveyor, caplog: pytest.LogCaptureFixture
) -> None:
    @app.on_attempt_start
    def broken_start(event: AttemptStarted) -> None:
        raise RuntimeError("hook bug")

    @app.on_attempt_end
    def broken_end(event: AttemptEnded) -> None:
        raise RuntimeError("hook bug too")

    @app.job()
    async def fine(ctx: JobContext) -> int:
        return 1

    caplog.set_level(logging.ERROR, logger="conveyor.hooks")
    jobs = [await fine.submit() for _ in range(2)]
    async with running_worker(app):
        for job in jobs:
            await settled(job, Status.SUCCEEDED)
    messages = [r.getMessage() for r in caplog.records if r.name == "conveyor.hooks"]
    assert sum(m.endswith(".broken_start raised; ignored") for m in messages) == 2
    assert sum("broken_end raised; ignored" in m for m in messages) == 2
    assert all(r.exc_info for r in caplog.records if r.name == "conveyor.hooks")
