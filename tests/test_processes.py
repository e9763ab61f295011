"""Crash, signal and lease behaviour with real worker processes on every backend."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from conveyor import Conveyor, Outcome, Status, Submission
from tests.processes import FAST, WorkerProcesses, freeze_between_writes, wait_exit

pytestmark = pytest.mark.processes


async def test_three_workers_drain_3000_jobs_exactly_once(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    jobs = await procs_app.submit_many([Submission("noop", {"i": i}) for i in range(3000)])
    procs = [workers.start("--burst", "--concurrency", "20", *FAST) for _ in range(3)]
    for proc in procs:
        assert await wait_exit(proc, 120) == 0
    runs = workers.runs_per_job()
    assert len(runs) == 3000, "every job ran"
    assert set(runs.values()) == {1}, "no job ran twice"
    assert len({r.pid for r in workers.records()}) >= 2, "the work was shared"
    done = await procs_app.list_jobs(status=["succeeded"], limit=1000)
    assert len(done) == 1000
    left = await procs_app.list_jobs(status=["queued", "running"], limit=10)
    assert left == []
    assert {j.id for j in jobs} == set(runs)


async def test_sigkill_mid_job_is_rescued_by_another_worker(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    job = await procs_app.submit("sleepy", {"seconds": 1.5})
    first = workers.start(*FAST)
    started = workers.wait_for_record("start", job.id, pid=first.pid)
    assert started.attempt == 1
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    second = workers.start(*FAST)
    await job.wait(timeout=30)
    assert job.status is Status.SUCCEEDED
    assert job.result == {"pid": second.pid}
    attempts = await job.attempts()
    assert [a.outcome for a in attempts] == [Outcome.LOST, Outcome.SUCCEEDED]
    assert str(first.pid) in (attempts[0].worker_id or "")


@pytest.mark.parametrize("job_type", ["sleepy", "sync_sleepy"])
async def test_sigterm_hands_the_job_back_without_spending_an_attempt(
    procs_app: Conveyor, workers: WorkerProcesses, job_type: str
) -> None:
    job = await procs_app.submit(job_type, {"seconds": 30})
    first = workers.start(*FAST, "--grace", "0.5", "--cancel-grace", "0.5")
    workers.wait_for_record("start", job.id, pid=first.pid)
    stopped_at = time.monotonic()
    first.send_signal(signal.SIGTERM)
    assert await wait_exit(first, 15) == 0
    # Grace (0.5 s) plus cancel grace (0.5 s) plus process teardown.
    assert time.monotonic() - stopped_at < 10
    await job.refresh()
    assert job.status is Status.QUEUED
    assert job.attempt == 0
    assert await job.attempts() == []
    assert "handing back 1 jobs" in workers.log(0)


async def test_sigterm_lets_a_short_job_finish_within_the_grace_period(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    job = await procs_app.submit("sleepy", {"seconds": 0.5})
    first = workers.start(*FAST, "--grace", "10")
    workers.wait_for_record("start", job.id, pid=first.pid)
    first.send_signal(signal.SIGTERM)
    assert await wait_exit(first, 15) == 0
    await job.refresh()
    assert job.status is Status.SUCCEEDED
    assert [a.outcome for a in await job.attempts()] == [Outcome.SUCCEEDED]


async def test_a_stopped_zombie_cannot_complete_the_job(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    job = await procs_app.submit("sleepy", {"seconds": 2})
    zombie = workers.start(*FAST)
    workers.wait_for_record("start", job.id, pid=zombie.pid)
    freeze_between_writes(zombie, workers.direct_url, job.id)
    try:
        rescuer = workers.start(*FAST)
        workers.wait_for_record("start", job.id, pid=rescuer.pid, timeout=30)
    finally:
        zombie.send_signal(signal.SIGCONT)
    await job.wait(timeout=30)
    assert job.status is Status.SUCCEEDED
    assert job.result == {"pid": rescuer.pid}
    outcomes = [a.outcome for a in await job.attempts()]
    assert outcomes == [Outcome.LOST, Outcome.SUCCEEDED]
    # The zombie woke up, lost its lease, and kept serving: it did not exit.
    await asyncio.sleep(1.0)
    assert zombie.poll() is None
    await job.refresh()
    assert job.result == {"pid": rescuer.pid}


async def test_second_signal_stops_at_once(procs_app: Conveyor, workers: WorkerProcesses) -> None:
    job = await procs_app.submit("sleepy", {"seconds": 30})
    proc = workers.start(*FAST, "--grace", "60")
    workers.wait_for_record("start", job.id, pid=proc.pid)
    proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    code = await wait_exit(proc, 10)
    assert code == 128 + signal.SIGTERM
    # The lease is left to expire; another worker rescues the job and runs it again.
    second = workers.start(*FAST)
    rerun = workers.wait_for_record("start", job.id, pid=second.pid, timeout=30)
    assert rerun.attempt == 2
    assert [a.outcome for a in await job.attempts()] == [Outcome.LOST]


async def test_sigkill_at_60_percent_resumes_from_the_last_checkpoint(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    job = await procs_app.submit("video", {"frames": 200})
    first = workers.start(*FAST)
    seen: list[float] = []
    killed = False
    async with asyncio.timeout(60):
        while not (await job.refresh()).terminal:
            if job.progress is not None:
                seen.append(job.progress.done)
            if not killed and job.progress is not None and job.progress.done >= 120:
                first.send_signal(signal.SIGKILL)
                first.wait(10)
                killed = True
                workers.start(*FAST)
            await asyncio.sleep(0.02)
    assert job.status is Status.SUCCEEDED
    resumed = job.result["resumed_from"]
    assert 110 <= resumed <= 200, f"resumed from frame {resumed}"
    assert seen == sorted(seen), "progress went backwards for a reader"
    assert [a.outcome for a in await job.attempts()] == [Outcome.LOST, Outcome.SUCCEEDED]
    starts = [r.event for r in workers.records() if r.job_id == job.id]
    assert starts == ["resume@0", f"resume@{resumed}"]
