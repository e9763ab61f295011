"""Bulk jobs with real worker processes (issue #12): a cancel outlives the worker that was
to act on it, and a fan-out of 10,000 children keeps consistent counts under 3 workers."""

from __future__ import annotations

import asyncio
import signal

import pytest

from conveyor import Conveyor, JobHandle, JobNotFound, Outcome, Status
from conveyor.core.model import TreeCounts
from tests.processes import FAST, WorkerProcesses, freeze_between_writes

pytestmark = pytest.mark.processes


async def test_a_cancel_asked_before_its_worker_is_killed_ends_the_job_cancelled(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    job = await procs_app.submit("sleepy", {"seconds": 30})
    first = workers.start(*FAST)
    workers.wait_for_record("start", job.id, pid=first.pid)
    # Frozen, the worker cannot hear the cancel; then it dies without acting on it.
    freeze_between_writes(first, workers.direct_url, job.id)
    asked = await procs_app.cancel(job.id, reason="not needed any more")
    assert (asked.status, asked.record.cancel_requested) == (Status.RUNNING, True)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    workers.start(*FAST)
    await job.wait(timeout=60)
    assert (job.status, job.error) == (Status.CANCELLED, "not needed any more")
    assert [a.outcome for a in await job.attempts()] == [Outcome.LOST]
    assert workers.runs_per_job("start")[job.id] == 1, "never run again"


# One backend: the counts are the same statements on both (tests/test_bulk.py), and SQLite
# drains the 10,000 children in half the time on a loaded machine.
@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_root_with_10000_children_on_3_workers_counts_consistently(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    n = 10_000
    root = await procs_app.submit("fanout", {"n": n})
    # Leases long enough that a loaded machine does not make items lose theirs (and fail
    # the root for it): this test is about the counts.
    for _ in range(3):
        workers.start("--concurrency", "50", "--lease", "15", "--poll-interval", "0.1")
    reads, done = 0, 0
    async with asyncio.timeout(600):
        while not (await root.refresh()).terminal:
            below = root.below
            if below is not None:  # the children are spawned in one write: all, or none
                counts = below.by_status()
                assert min(counts.values()) >= 0 and sum(counts.values()) == below.total == n
                assert below.done >= done, "progress never goes back"
                done, reads = below.done, reads + 1
            await asyncio.sleep(0.005)
    assert root.status is Status.SUCCEEDED
    assert root.below == TreeCounts(succeeded=n)
    assert reads > 10, "the reader saw the tree while it ran"
    assert len(await procs_app.list_jobs(include_children=True, limit=1000)) == 1000


async def test_a_cancelled_parent_fires_on_complete_once_its_running_children_stopped(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    """Issue #30 item 7: the callback fired at the cancel, its counts leaving out the
    running children (total 2 of 8 here)."""
    await procs_app.pause("held")
    root = await procs_app.submit("held_batch", {"running": 6, "held": 2})
    workers.start(*FAST, "--concurrency", "8")
    for i in range(6):
        workers.wait_for_record("start", f"{root.id}.{i}", timeout=60)
    async with asyncio.timeout(60):  # its handler returned: it waits for its children
        while (await root.refresh()).status is not Status.WAITING:
            await asyncio.sleep(0.05)
    asked = await procs_app.cancel(root.id, reason="not needed any more")
    callback = await eventually_get(procs_app, f"{root.id}.on_complete")
    await callback.wait(timeout=60)
    assert callback.result == {
        "job_id": root.id, "status": "cancelled", "pending": 0, "queued": 0, "running": 0,
        "waiting": 0, "succeeded": 0, "failed": 0, "cancelled": 8, "done": 8, "total": 8,
    }  # fmt: skip
    children = await procs_app.children(root.id)
    assert len(children) == 8 and all(c.status is Status.CANCELLED for c in children)
    ended = max(c.record.finished_at for c in children if c.record.finished_at)
    assert callback.record.created_at >= ended, "fired once everything below had ended"
    assert workers.runs_per_job("end") == {}, "the running children were stopped"
    # Like a running job, the parent was asked to stop: it waited for what ran below it.
    assert (asked.status, asked.record.cancel_requested) == (Status.WAITING, True)
    await root.refresh()
    assert (root.status, root.error) == (Status.CANCELLED, "not needed any more")
    assert root.below == TreeCounts(cancelled=8)


async def eventually_get(app: Conveyor, job_id: str) -> JobHandle:
    """The job of this id, once it exists."""
    async with asyncio.timeout(60):
        while True:
            try:
                return await app.get(job_id)
            except JobNotFound:
                await asyncio.sleep(0.05)
