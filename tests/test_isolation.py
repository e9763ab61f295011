"""Process isolation: the handler runs in a child process the worker can kill and survive."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conveyor import ConfigurationError, Conveyor, JobContext, Outcome, Status
from tests.apps import isolated, slow_start
from tests.helpers import running_worker, settled


@pytest.fixture
async def iso(db_url: str) -> AsyncIterator[Conveyor]:
    isolated.app.url = db_url
    yield isolated.app
    await isolated.app.close()


async def test_isolated_handler_reports_progress_and_checkpoints(iso: Conveyor) -> None:
    sync_job = await iso.submit("crunch", {"n": 200_000})
    async_job = await iso.submit("crunch_async", {"n": 1000})
    async with running_worker(iso):
        await settled(sync_job, Status.SUCCEEDED, timeout=60)
        await settled(async_job, Status.SUCCEEDED, timeout=60)
    assert sync_job.result["total"] == sum(i * i for i in range(200_000))
    assert sync_job.result["pid"] != os.getpid()
    assert sync_job.state == {"done": 200_000}
    assert sync_job.progress is not None and sync_job.progress.done == 200_000
    assert async_job.result == sum(range(1000)) and async_job.state == {"started": True}


@pytest.mark.parametrize(
    ("job_type", "payload", "message"),
    [
        ("exits", {}, "exit code 1"),
        ("segfaults", {}, "killed by SIGSEGV"),
        ("hogs_memory", {"limit_mb": 300}, "MemoryError"),
    ],
)
async def test_a_crashing_child_fails_the_attempt_and_the_worker_survives(
    iso: Conveyor, job_type: str, payload: dict[str, int], message: str
) -> None:
    job = await iso.submit(job_type, payload)
    after = await iso.submit("crunch_async", {"n": 10})
    async with running_worker(iso):
        await settled(job, Status.FAILED, timeout=60)
        await settled(after, Status.SUCCEEDED, timeout=60)
    assert message in (job.error or "")
    assert [a.outcome for a in await job.attempts()] == [Outcome.FAILED]


async def test_a_child_that_ignores_cancellation_is_killed(iso: Conveyor) -> None:
    job = await iso.submit("ignores_cancel", {})
    after = await iso.submit("crunch_async", {"n": 10})
    async with running_worker(iso, lease=0.6, cancel_grace=0.5):

        async def running() -> bool:
            return (await job.refresh()).status is Status.RUNNING

        while not await running():
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # let the child start and ignore SIGTERM
        await iso.cancel(job.id)
        await settled(job, Status.CANCELLED, timeout=30)
        await settled(after, Status.SUCCEEDED, timeout=30)
    assert [a.outcome for a in await job.attempts()] == [Outcome.CANCELLED]


async def test_a_hung_child_is_killed_on_timeout_and_retried(iso: Conveyor) -> None:
    job = await iso.submit("hangs_first", {})
    async with running_worker(iso, cancel_grace=0.3):
        await settled(job, Status.SUCCEEDED, timeout=60)
    assert job.result == "second attempt"
    assert [a.outcome for a in await job.attempts()] == [Outcome.TIMED_OUT, Outcome.SUCCEEDED]


async def test_a_slow_child_start_is_not_charged_to_the_handlers_time_limit(db_url: str) -> None:
    slow_start.app.url = db_url
    try:
        job = await slow_start.app.submit("quick", {})
        async with running_worker(slow_start.app):
            await settled(job, Status.SUCCEEDED, timeout=60)
        assert job.result == "done"
    finally:
        await slow_start.app.close()


def test_a_handler_the_child_cannot_import_is_refused(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path / 'c.db'}")
    with pytest.raises(ConfigurationError, match="top level of an importable module"):

        @app.job(isolation="process")
        def local(ctx: JobContext) -> None:
            return None
