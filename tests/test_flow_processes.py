"""Flow control with several real worker processes, on every backend."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conveyor import Conveyor, JobHandle, Status, Submission
from tests.processes import ROOT, WorkerProcesses

pytestmark = pytest.mark.processes

FAST = ("--lease", "1", "--rescue-interval", "0.2", "--poll-interval", "0.1")


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(db_url, tmp_path / "runs.log", tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Conveyor]:
    from tests.apps import procs

    app = procs.app
    app.url = db_url
    await app.migrate()
    yield app
    await app.close()


async def all_done(app: Conveyor, jobs: list[JobHandle], timeout: float = 120) -> None:
    for job in jobs:
        await job.wait(timeout=timeout)
        assert job.status is Status.SUCCEEDED, job.error


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


async def test_global_concurrency_holds_across_four_workers(
    client: Conveyor, workers: WorkerProcesses
) -> None:
    jobs = await client.submit_many([Submission("limited", {}) for _ in range(50)])
    for _ in range(4):
        workers.start("--concurrency", "10", *FAST)
    await all_done(client, jobs)
    records = workers.records()
    starts = {r.job_id: r.at for r in records if r.event == "start"}
    ends = {r.job_id: r.at for r in records if r.event == "end"}
    assert set(starts) == set(ends) == {j.id for j in jobs}, "all complete"
    assert max_overlap([(starts[j], ends[j]) for j in starts]) <= 2


async def test_a_killed_worker_frees_its_global_slot_when_its_lease_expires(
    client: Conveyor, workers: WorkerProcesses
) -> None:
    first = await client.submit("singleton", {"seconds": 30})
    holder = workers.start(*FAST)
    workers.wait_for_record("start", first.id, pid=holder.pid)
    holder.kill()
    holder.wait(10)
    second = await client.submit("singleton", {"seconds": 0.1})
    other = workers.start(*FAST)
    # Either job may take the slot first once the lease has expired; both get to run.
    workers.wait_for_record("start", second.id, pid=other.pid, timeout=30)
    await second.wait(timeout=30)
    assert second.status is Status.SUCCEEDED


async def test_rate_limit_holds_across_three_workers_and_other_types_run(
    client: Conveyor, workers: WorkerProcesses
) -> None:
    rated = await client.submit_many([Submission("rated", {}) for _ in range(200)])
    free = await client.submit_many([Submission("unlimited", {}) for _ in range(50)])
    for _ in range(3):
        workers.start("--concurrency", "20", *FAST)
    await all_done(client, [*rated, *free])
    records = workers.records()
    rated_ids = {j.id for j in rated}
    starts = sorted(r.at for r in records if r.job_id in rated_ids)
    assert len(starts) == 200
    # The limit counts claims; a handler starts a few milliseconds after its claim, so a
    # window of handler starts is measured 50 ms short of the limit's one second.
    worst = max(sum(1 for t in starts[i:] if t < start + 0.95) for i, start in enumerate(starts))
    assert worst <= 20, f"{worst} starts within 0.95 s"
    assert (starts[-1] - starts[0]) >= 199 / 20 - 1.0
    free_starts = [r.at for r in records if r.job_id in {j.id for j in free}]
    assert len(free_starts) == 50
    assert max(free_starts) < starts[len(starts) // 2], "other types were not held back"


async def test_five_workers_fire_each_cron_tick_exactly_once(
    db_url: str, workers: WorkerProcesses
) -> None:
    speed = 600.0  # one minute of store time every 0.1 s
    start = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC).timestamp()
    real = time.time() + 3.0  # let the workers start first
    env = {
        "CONVEYOR_TEST_CLOCK_START": str(start),
        "CONVEYOR_TEST_CLOCK_REAL": str(real),
        "CONVEYOR_TEST_CLOCK_SPEED": str(speed),
    }
    for _ in range(5):
        workers.start(
            "--cron-interval",
            "0.01",
            "--poll-interval",
            "0.2",
            app="tests.apps.cron:app",
            env_extra=env,
        )
    # Run until store time has passed 100 ticks (and a little more), then stop.
    await asyncio.sleep(max(0.0, real - time.time()) + 100 * 60 / speed + 1.0)
    workers.stop_all()
    app = Conveyor(db_url)
    try:
        jobs = await app.list_jobs(type="tick", limit=1000)
    finally:
        await app.close()
    ticks = sorted(j.id for j in jobs)
    # The 100 ticks from 00:01 to 01:40 of store time (the clock also ran before 00:00
    # while the workers started; those ticks fired too, once each).
    first_100 = [
        t
        for t in ticks
        if "cron:every-minute:2026-01-01T00:01" <= t < "cron:every-minute:2026-01-01T01:41"
    ]
    assert len(first_100) == 100
    assert len(ticks) == len(set(ticks))
    minutes = [datetime.strptime(t.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ") for t in first_100]
    assert all((b - a).total_seconds() == 60 for a, b in itertools.pairwise(minutes))


def test_two_processes_racing_for_a_named_lease_never_both_hold_it(
    db_url: str, tmp_path: Path
) -> None:
    record = tmp_path / "holds.log"
    command = [sys.executable, "-m", "tests.apps.leases", db_url, "500", str(record)]
    racers = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        codes = [racer.wait(300) for racer in racers]
    finally:
        for racer in racers:  # one failing must not leave the other running
            if racer.poll() is None:
                racer.kill()
                racer.wait()
    assert codes == [0, 0]
    holds = []
    for line in record.read_text().splitlines():
        pid, token, start, end = line.split()
        holds.append((int(token), float(start), float(end), int(pid)))
    holds.sort()
    assert len(holds) >= 100
    assert len({h[0] for h in holds}) == len(holds), "every holding has its own token"
    for (_, _, end, _), (_, start, _, _) in itertools.pairwise(holds):
        assert end <= start, "two holders at once"


def test_processes_opening_a_new_sqlite_file_at_the_same_instant_all_succeed(
    tmp_path: Path,
) -> None:
    """SQLite may refuse the switch to WAL at once, without waiting, while another process
    opens the same new file: opening tries again instead of failing."""
    failures = []
    for round_ in range(10):
        url = f"sqlite:///{tmp_path / f'new-{round_}.db'}"
        start_at = f"{time.time() + 1.0:.6f}"
        command = [sys.executable, "-m", "tests.apps.opener", url, start_at]
        openers = [
            subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True) for _ in range(4)
        ]
        for opener in openers:
            _, err = opener.communicate(timeout=120)
            if opener.returncode != 0:
                failures.append(err.strip().splitlines()[-1])
    assert not failures, failures
