"""PostgreSQL with real worker processes: many workers on one database, a server restart
while they are busy, and a worker machine whose clock is ten minutes ahead.

Runs are recorded outside the database under test (tests/apps/procs.py appends a line per
handler start and end to a file), so "exactly once" is checked against what really ran.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor import Conveyor, Outcome, Status, Submission
from conveyor.core.model import NewJob
from conveyor.errors import DatabaseUnavailable, StorageError
from conveyor.store import Lease
from conveyor.store.postgres import PostgresStore
from tests.processes import WorkerProcesses, wait_exit

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.processes


@pytest.fixture
def db_url(postgres_database: str) -> str:
    """Only PostgreSQL here: the shared ``workers`` and ``procs_app`` fixtures use this."""
    return postgres_database


async def _client(url: str) -> Conveyor:
    from tests.apps import procs

    app = procs.app
    app.url = url
    await app.migrate()
    return app


async def test_four_workers_drain_20000_jobs_each_exactly_once(
    procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    jobs = await procs_app.submit_many([Submission("noop", {"i": i}) for i in range(20_000)])
    started = time.monotonic()
    procs = [
        workers.start("--burst", "--concurrency", "25", "--poll-interval", "0.5") for _ in range(4)
    ]
    for proc in procs:
        assert await wait_exit(proc, 300) == 0
    elapsed = time.monotonic() - started
    runs = workers.runs_per_job()
    assert set(runs) == {j.id for j in jobs}, "every job ran"
    assert set(runs.values()) == {1}, "no job ran twice"
    per_worker = Counter(r.pid for r in workers.records())
    assert len(per_worker) == 4, f"the work was shared: {per_worker}"
    left = await procs_app.list_jobs(status=["queued", "running"], limit=10)
    assert left == []
    print(f"4 workers drained 20000 jobs in {elapsed:.1f}s; per worker: {dict(per_worker)}")


# -- a restart of the server ------------------------------------------------------------


@dataclass
class Cluster:
    """A throwaway PostgreSQL cluster of this machine's packaged server."""

    version: str
    name: str
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, action: str) -> None:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action],
            check=True,
            capture_output=True,
            timeout=120,
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster of its own, so that restarting it disturbs no other test."""
    tools = [shutil.which(t) for t in ("pg_createcluster", "pg_ctlcluster", "pg_dropcluster")]
    if not all(tools) or os.geteuid() != 0:
        reason = "restarting a server needs Debian's pg_*cluster tools, run as root"
        if os.environ.get("CI"):
            raise RuntimeError(reason)
        pytest.skip(reason)
    versions = sorted(os.listdir("/usr/lib/postgresql"), key=lambda v: float(v))
    made = Cluster(versions[-1], f"conveyor_restart_{uuid.uuid4().hex[:8]}", _free_port())
    subprocess.run(
        ["pg_createcluster", made.version, made.name, "-p", str(made.port), "--", "--auth=trust"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        made.ctl("start")
        yield made
    finally:
        subprocess.run(
            ["pg_dropcluster", "--stop", made.version, made.name],
            capture_output=True,
            timeout=120,
        )


async def _count_succeeded(url: str) -> int | None:
    """Jobs succeeded so far, or None while the server cannot be reached."""
    try:
        async with await psycopg.AsyncConnection.connect(url, connect_timeout=2) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM conveyor_jobs WHERE status = 'succeeded'"
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0
    except psycopg.OperationalError:
        return None


async def test_a_server_restart_while_four_workers_are_busy_loses_and_repeats_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    app = await _client(cluster.url)
    workers = WorkerProcesses(cluster.url, tmp_path / "runs.log", tmp_path)
    total = 600
    try:
        jobs = await app.submit_many(
            [Submission("sleepy", {"seconds": 0.25}) for _ in range(total)]
        )
        await app.close()
        procs = [
            workers.start(
                "--concurrency",
                "10",
                "--lease",
                "10",
                "--poll-interval",
                "0.5",
                "--rescue-interval",
                "1",
            )
            for _ in range(4)
        ]
        # Restart once a good part of the work is done and the rest is in flight.
        deadline = time.monotonic() + 60
        while len([r for r in workers.records() if r.event == "end"]) < total // 4:
            assert time.monotonic() < deadline, "the workers did not get going"
            await asyncio.sleep(0.05)
        before = len([r for r in workers.records() if r.event == "end"])
        restart_began = time.time()
        await asyncio.to_thread(cluster.ctl, "restart")
        restarted = time.time()
        # Every job completes; wait on the database, which is back.
        deadline = time.monotonic() + 120
        while (await _count_succeeded(cluster.url) or 0) < total:
            assert time.monotonic() < deadline, "not every job completed after the restart"
            await asyncio.sleep(0.2)
        ends = sorted(r.at for r in workers.records() if r.event == "end")
        pause = max(b - a for a, b in itertools.pairwise(ends))
        back = min(at for at in ends if at > restarted) - restarted

        assert all(p.poll() is None for p in procs), "a worker exited"
        starts = workers.runs_per_job("start")
        finished = workers.runs_per_job("end")
        assert set(finished) == {j.id for j in jobs}, "every job ran to its end"
        assert set(finished.values()) == {1}, "no job ran to its end twice"
        assert set(starts.values()) == {1}, "no job was started twice (no lease was lost)"
        async with await psycopg.AsyncConnection.connect(cluster.url) as conn:
            cur = await conn.execute(
                "SELECT outcome, count(*) FROM conveyor_attempts GROUP BY outcome"
            )
            outcomes = dict(await cur.fetchall())
        assert outcomes == {Outcome.SUCCEEDED.value: total}

        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert await wait_exit(proc, 30) == 0
        # The outage is logged, not flooded: a handful of lines per worker.
        for index in range(len(procs)):
            log = workers.log(index)
            noisy = [
                line
                for line in log.splitlines()
                if re.search(r"\b(ERROR|WARNING)\b", line) or "Traceback" in line
            ]
            assert len(noisy) <= 12, f"worker {index} logged {len(noisy)} lines:\n{log}"
            assert "Traceback" not in log
            # A settle whose answer the restart lost was recorded all the same: no lease
            # was lost (no job started twice), so none may be reported lost.
            assert "lease lost" not in log, log
        print(
            f"\nrestart took {restarted - restart_began:.1f}s with {before}/{total} jobs done; "
            f"longest pause between two job ends {pause:.1f}s; first end {back:.2f}s after "
            "the restart command returned"
        )
    finally:
        workers.stop_all()
        await app.close()


async def test_while_the_server_is_down_operations_fail_fast_then_recover(
    cluster: Cluster,
) -> None:
    store = PostgresStore(cluster.url)
    await store.open()
    try:
        await store.submit([NewJob(id="a", type="t", payload={})])
        (job,) = await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
        held = [Lease("a", job.lease_token)]
        await asyncio.to_thread(cluster.ctl, "stop")

        # A heartbeat gives up within a small part of the lease (here 3 s), so that the
        # worker can stop its runs before their leases could expire.
        began = time.monotonic()
        with pytest.raises((TimeoutError, StorageError)):
            await store.heartbeat(worker_id="w", leases=held, lease=3.0, progress={})
        assert time.monotonic() - began < 1.0
        # Other operations wait a few seconds for the server, then raise (not hang) an
        # error that says what is wrong: the driver's own never escapes.
        began = time.monotonic()
        unreachable = r"check that the server is running|the server is down"
        with pytest.raises(StorageError, match=unreachable) as caught:
            await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
        assert time.monotonic() - began < 8.0
        assert isinstance(caught.value, DatabaseUnavailable)
        assert str(cluster.port) in str(caught.value)

        await asyncio.to_thread(cluster.ctl, "start")
        began = time.monotonic()
        while True:
            try:
                beat = await store.heartbeat(worker_id="w", leases=held, lease=3.0, progress={})
                break
            except (TimeoutError, StorageError):
                assert time.monotonic() - began < 30, "the store did not reconnect"
                await asyncio.sleep(0.1)
        assert beat.lost == frozenset()
        print(f"\nfirst heartbeat {time.monotonic() - began:.2f}s after the server was up")
    finally:
        await store.close()


# -- a skewed clock -----------------------------------------------------------------------


async def test_a_worker_whose_clock_is_ten_minutes_ahead_rescues_only_expired_leases(
    postgres_database: str, procs_app: Conveyor, workers: WorkerProcesses
) -> None:
    owner = PostgresStore(postgres_database)
    await owner.open()
    try:
        # Other workers hold two jobs: "live" with a 60 s lease its worker keeps, "dead"
        # with a lease that runs out in a second (its worker died).
        live = await procs_app.submit("noop", {"i": 1})
        (held,) = await owner.claim(worker_id="honest", queues=["default"], limit=1, lease=60)
        assert held.id == live.id
        dead = await procs_app.submit("noop", {"i": 2})
        (gone,) = await owner.claim(worker_id="crashed", queues=["default"], limit=1, lease=1)
        assert gone.id == dead.id

        skewed = workers.start(
            "--rescue-interval",
            "0.2",
            "--poll-interval",
            "0.2",
            app="tests.apps.skewed:app",
            env_extra={"CONVEYOR_TEST_CLOCK_OFFSET": "600"},
        )
        # The skewed worker rescues the dead lease once the server says it expired, and
        # runs the job: its rescuer is working.
        workers.wait_for_record("run", dead.id, pid=skewed.pid, timeout=30)
        await asyncio.sleep(1.0)  # several more rescue rounds
        after = await owner.get(live.id)
        assert after is not None and after.status is Status.RUNNING
        assert after.lease_owner == "honest" and after.lease_token == held.lease_token
        assert after.lease_expires_at == held.lease_expires_at
        assert next(a.outcome for a in await procs_app.attempts(dead.id)) is Outcome.LOST
        assert live.id not in workers.runs_per_job()
    finally:
        await owner.close()
