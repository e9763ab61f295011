"""Rolling deploys and the worker registry, with real worker processes on both backends.

During a deploy old and new workers run side by side: a worker claims only the job types
it has handlers for, so a type only the new release knows waits, its attempts unspent,
for a worker that can run it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from conveyor import Conveyor, JobHandle, Status, Submission
from tests.processes import WorkerProcesses, wait_exit

pytestmark = pytest.mark.processes

OLD = "tests.apps.deploys:old"
# A lease long enough that a loaded machine's stalled heartbeat does not lose a run and
# spend a second attempt (not what these tests are about); quick polls and rescues.
OPTIONS = ("--lease", "10", "--rescue-interval", "0.2", "--poll-interval", "0.1")
NEW = "tests.apps.deploys:new"


@pytest.fixture
async def release(db_url: str) -> AsyncIterator[Conveyor]:
    """The new release's application, on the test's migrated database."""
    from tests.apps import deploys

    application = deploys.new
    application.url = db_url
    await application.migrate()
    yield application
    await application.close()


async def _wait_done(jobs: list[JobHandle], timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        for job in jobs:
            await job.wait()


async def test_an_old_worker_never_spends_an_attempt_of_a_type_it_lacks(
    release: Conveyor, workers: WorkerProcesses
) -> None:
    old = workers.start(*OPTIONS, app=OLD)
    new = workers.start(*OPTIONS, app=NEW)
    await workers.wait_registered()
    reports = await release.submit_many([Submission("build_report", {"n": i}) for i in range(20)])
    emails = await release.submit_many([Submission("send_email", {"n": i}) for i in range(20)])
    await _wait_done([*reports, *emails])
    for job in reports:
        await job.refresh()
        assert job.status is Status.SUCCEEDED, job.error
        assert await _ran_on(job) == {new.pid}
    assert {r.pid for r in workers.records() if r.job_id in {j.id for j in reports}} == {new.pid}

    # The new worker leaves; the old one stays up. New-type jobs submitted now wait with
    # their attempts unspent, while the old worker keeps running the types it knows.
    new.send_signal(signal.SIGTERM)
    assert await wait_exit(new, 30) == 0
    waiting = await release.submit_many([Submission("build_report", {"n": i}) for i in range(5)])
    later = await release.submit_many([Submission("send_email", {"n": i}) for i in range(5)])
    await _wait_done(later)  # claimed after the reports were due, ahead of them in order
    for job in waiting:
        await job.refresh()
        assert (job.status, job.attempt) == (Status.QUEUED, 0)
        assert await job.attempts() == []
    assert {r.pid for r in workers.records() if r.job_id in {j.id for j in later}} == {old.pid}
    assert "no handler for job type" not in workers.log(0)
    # And status says why they wait.
    status = subprocess.run(
        [sys.executable, "-m", "conveyor", "status", "--database-url", release.url],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="1000"),
    )
    assert "5 jobs waiting for type 'build_report', which no live worker serves" in status.stdout
    assert [(t.type, t.queued) for t in await release.unserved_types()] == [("build_report", 5)]

    # The new release's worker comes back and runs them.
    back = workers.start(*OPTIONS, app=NEW)
    await _wait_done(waiting)
    for job in waiting:
        await job.refresh()
        assert job.status is Status.SUCCEEDED, job.error
        assert await _ran_on(job) == {back.pid}
    assert {r.pid for r in workers.records() if r.job_id in {j.id for j in waiting}} == {back.pid}


async def _ran_on(job: JobHandle) -> set[int]:
    """The pids of the workers that spent the job's attempts (worker ids hold the pid)."""
    return {int((a.worker_id or "").split("-")[-2]) for a in await job.attempts()}


async def test_a_killed_worker_leaves_the_verdict_after_its_forget_window(
    release: Conveyor, workers: WorkerProcesses
) -> None:
    healthy = workers.start(*OPTIONS, "--prune-interval", "0.2", app=NEW)
    doomed = workers.start("--lease", "1", "--forget-after", "4", app=NEW)
    await workers.wait_registered()
    doomed_id = next(w.id for w in await release.workers() if w.pid == doomed.pid)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(10)
    async with asyncio.timeout(60):
        while (await release.health()).counts.dead_workers != 1:  # silent past its lease
            await asyncio.sleep(0.1)
        assert (await release.health()).status == "degraded"
        # Past its forget window: healthy again while the healthy worker runs, and the
        # healthy worker's duty removes it from the registry.
        while (await release.health()).status != "healthy":
            await asyncio.sleep(0.1)
        while doomed_id in {w.id for w in await release.workers()}:
            await asyncio.sleep(0.1)
    assert healthy.poll() is None
