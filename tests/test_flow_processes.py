"""Flow control with several real worker processes, on every backend."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conveyor import Conveyor, JobHandle, Status, Submission
from conveyor.core.cron import tick_id
from conveyor.core.model import Job
from conveyor.store import Store, create_store, sqlite_path
from tests.helpers import eventually
from tests.processes import FAST, ROOT, WorkerProcesses

pytestmark = pytest.mark.processes


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
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    jobs = await procs_app.submit_many([Submission("limited", {}) for _ in range(50)])
    for _ in range(4):
        workers.start("--concurrency", "10", *FAST)
    await all_done(procs_app, jobs)
    records = workers.records()
    starts = {r.job_id: r.at for r in records if r.event == "start"}
    ends = {r.job_id: r.at for r in records if r.event == "end"}
    assert set(starts) == set(ends) == {j.id for j in jobs}, "all complete"
    assert max_overlap([(starts[j], ends[j]) for j in starts]) <= 2


async def test_a_killed_worker_frees_its_global_slot_when_its_lease_expires(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    first = await procs_app.submit("singleton", {"seconds": 30})
    holder = workers.start(*FAST)
    workers.wait_for_record("start", first.id, pid=holder.pid)
    holder.kill()
    holder.wait(10)
    second = await procs_app.submit("singleton", {"seconds": 0.1})
    other = workers.start(*FAST)
    # Either job may take the slot first once the lease has expired; both get to run.
    workers.wait_for_record("start", second.id, pid=other.pid, timeout=30)
    await second.wait(timeout=30)
    assert second.status is Status.SUCCEEDED


async def test_rate_limit_holds_across_three_workers_and_other_types_run(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    rated = await procs_app.submit_many([Submission("rated", {}) for _ in range(200)])
    free = await procs_app.submit_many([Submission("unlimited", {}) for _ in range(50)])
    for _ in range(3):
        workers.start("--concurrency", "20", *FAST)
    await all_done(procs_app, [*rated, *free])
    # The limit counts claims, so it is checked against the claim times the database
    # recorded (a job's started_at), not against handler starts: on a loaded machine a
    # handler can start long after its claim, and handlers of two windows bunch up.
    claimed = await procs_app.store()
    starts = sorted(_started(j) for j in await claimed.get_many([j.id for j in rated]))
    assert len(starts) == 200
    worst = max(sum(1 for t in starts[i:] if t < start + 1.0) for i, start in enumerate(starts))
    assert worst <= 20, f"{worst} claims within 1 s"
    assert (starts[-1] - starts[0]) >= 199 / 20 - 1.0
    free_jobs = await claimed.get_many([j.id for j in free])
    free_starts = [_started(j) for j in free_jobs]
    assert len(free_starts) == 50
    assert max(free_starts) < starts[len(starts) // 2], "other types were not held back"


def _tick_ids(schedule: str, first: datetime, count: int, step: float) -> list[str]:
    return [tick_id(schedule, first + timedelta(seconds=i * step)) for i in range(count)]


async def _wait_for_jobs(url: str, job_ids: list[str], timeout: float) -> list[str]:
    """Wait until the last of ``job_ids`` exists, or ``timeout`` seconds if it never does
    (a tick skipped as late never fires); return those that exist then."""
    store = create_store(url)
    await store.open()
    try:
        with contextlib.suppress(TimeoutError):
            await eventually(lambda: _exists(store, job_ids[-1]), timeout=timeout, interval=0.1)
        return sorted(j.id for j in await store.get_many(job_ids))
    finally:
        await store.close()


async def _exists(store: Store, job_id: str) -> bool:
    return await store.get(job_id) is not None


async def test_five_workers_fire_each_cron_tick_exactly_once(
    db_url: str, workers: WorkerProcesses
) -> None:
    speed = 600.0  # one minute of store time every 0.1 s
    start = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC).timestamp()
    real = time.time()
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
    # Count only the ticks due once every worker is up (start-up takes seconds on a
    # loaded machine): the 100 minutes of store time after the next whole minute.
    await workers.wait_registered()
    ready = datetime.fromtimestamp(start + (time.time() - real) * speed, UTC)
    first = ready.replace(second=0, microsecond=0) + timedelta(minutes=2)
    window = _tick_ids("every-minute", first, 100, 60)
    fired = await _wait_for_jobs(db_url, window, timeout=60)
    workers.stop_all()
    assert fired == window, f"{len(set(window) - set(fired))} of 100 ticks did not fire"


async def test_workers_on_the_wall_clock_fire_every_tick_of_an_every_second_schedule_once(
    db_url: str, workers: WorkerProcesses
) -> None:
    """Default options, real time, the default ``skip`` catch-up: no tick is late enough
    to count as missed while the workers are healthy, and none fires twice.

    Healthy means that the database takes writes. Beside a CPU hog no worker of this
    machine fired for 7 s once: ticks more than the grace (5 s, ``check_grace``) late are
    then skipped, as designed. A window in which the test's own writes waited over a
    second is not counted, and the next one is watched (three at most); a window with a
    missed tick and no such wait fails the test.
    """
    env = {"CONVEYOR_TEST_SCHEDULE": "every-second"}
    for _ in range(5):
        workers.start("--queues", "ticks", app="tests.apps.cron:app", env_extra=env)
    await workers.wait_registered()
    stalls: list[float] = []
    for _ in range(3):
        with _WriteProbe(db_url) as probe:
            store = create_store(db_url)
            await store.open()
            try:
                ready = await store.now()
            finally:
                await store.close()
            first = ready.replace(microsecond=0) + timedelta(seconds=2)
            window = _tick_ids("every-second", first, 15, 1)
            fired = await _wait_for_jobs(db_url, window, timeout=60)
        if fired == window:
            break
        assert probe.longest > 1.0, (
            f"missed: {sorted(set(window) - set(fired))}, and the database took every write "
            f"of the test within {probe.longest:.2f}s"
        )
        stalls.append(probe.longest)
    else:
        pytest.fail(f"the database stalled in every window: writes waited {stalls} s")
    ran = Counter[str]()
    async with asyncio.timeout(30):
        while not set(window) <= set(ran := workers.runs_per_job("tick")):
            await asyncio.sleep(0.1)
    workers.stop_all()
    assert {t: ran[t] for t in window} == dict.fromkeys(window, 1), "a tick ran twice"


class _WriteProbe:
    """A thread that commits an empty write every 50 ms on the test's database and keeps
    the longest time one took: on SQLite the wait for the write lock (held by a worker's
    commit for as long as its fsync lasts), on PostgreSQL a commit of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _WriteProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        path = sqlite_path(self.url)
        if path is not None:
            conn = sqlite3.connect(path, timeout=60)
            conn.isolation_level = None
            statements = ["BEGIN IMMEDIATE", "COMMIT"]
        else:
            import psycopg

            conn = psycopg.connect(self.url, autocommit=True)  # type: ignore[assignment]
            statements = ["SELECT txid_current()"]  # an xid: its commit flushes the WAL
        try:
            while not self._stop.wait(0.05):
                before = time.monotonic()
                for statement in statements:
                    conn.execute(statement)
                self.longest = max(self.longest, time.monotonic() - before)
        finally:
            conn.close()


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
    for (_, _, ended, _), (_, began, _, _) in itertools.pairwise(holds):
        assert ended <= began, "two holders at once"


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


def _started(job: Job) -> float:
    """When a finished job was claimed (its last attempt's start), in epoch seconds."""
    assert job.started_at is not None, f"{job.id} never started"
    return job.started_at.timestamp()
