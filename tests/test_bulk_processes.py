"""Bulk jobs with real worker processes (issue #12): a cancel outlives the worker that was
to act on it, and a fan-out of 10,000 children keeps consistent counts under 3 workers."""

from __future__ import annotations

import asyncio
import signal

import pytest

from conveyor import Conveyor, Outcome, Status
from conveyor.core.model import TreeCounts
from tests.processes import FAST, WorkerProcesses

pytestmark = pytest.mark.processes


async def test_a_cancel_asked_before_its_worker_is_killed_ends_the_job_cancelled(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    job = await procs_app.submit("sleepy", {"seconds": 30})
    first = workers.start(*FAST)
    workers.wait_for_record("start", job.id, pid=first.pid)
    # Frozen, the worker cannot hear the cancel; then it dies without acting on it.
    first.send_signal(signal.SIGSTOP)
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
