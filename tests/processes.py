"""Real worker processes for tests: start ``conveyor worker`` subprocesses, wait until
they are registered, signal them, and read what their handlers recorded outside the
database. The ``workers`` and ``procs_app`` fixtures (tests/conftest.py) build on this."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from conveyor.store import create_store

ROOT = Path(__file__).resolve().parent.parent

# Short leases and intervals, so that process tests wait seconds rather than minutes.
FAST = ("--lease", "1", "--rescue-interval", "0.2", "--poll-interval", "0.1")


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait for a worker process to exit; return its exit code."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {proc.pid} still running after {timeout}s")
        await asyncio.sleep(0.05)
    return int(proc.returncode)


@dataclass
class Record:
    event: str
    job_id: str
    attempt: int
    pid: int
    at: float


class WorkerProcesses:
    """Starts worker processes of ``tests.apps.procs:app`` on one database."""

    def __init__(
        self, db_url: str, record_path: Path, log_dir: Path, *, direct_url: str | None = None
    ) -> None:
        self.db_url = db_url
        # Where the test itself reads the database (a direct URL when db_url is a pooler's).
        self.direct_url = direct_url or db_url
        self.record_path = record_path
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        *args: str,
        app: str = "tests.apps.procs:app",
        env_extra: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ) | (env_extra or {})
        env["CONVEYOR_TEST_RECORD"] = str(self.record_path)
        env["CONVEYOR_DATABASE_URL"] = self.db_url
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["COLUMNS"] = "1000"  # one log record per line, for tests that read the logs
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        command = [
            sys.executable,
            "-m",
            "conveyor",
            "--log-level",
            "INFO",
            "worker",
            app,
            "--database-url",
            self.db_url,
            *args,
        ]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, index: int) -> str:
        return (self.log_dir / f"worker-{index}.log").read_text(errors="replace")

    def records(self) -> list[Record]:
        if not self.record_path.exists():
            return []
        out = []
        for line in self.record_path.read_text().splitlines():
            event, job_id, attempt, pid, at = line.split()
            out.append(Record(event, job_id, int(attempt), int(pid), float(at)))
        return out

    def runs_per_job(self, event: str = "run") -> Counter[str]:
        return Counter(r.job_id for r in self.records() if r.event == event)

    def wait_for_record(
        self, event: str, job_id: str, *, timeout: float = 30.0, pid: int | None = None
    ) -> Record:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.records():
                if r.event == event and r.job_id == job_id and (pid is None or r.pid == pid):
                    return r
            time.sleep(0.02)
        raise TimeoutError(f"no {event!r} record for job {job_id} within {timeout}s")

    async def wait_registered(self, *, timeout: float = 60.0) -> None:
        """Wait until every started worker that is still alive has registered itself.

        A worker registers before it starts its duties, so after this every one of them
        is claiming and firing. Start-up takes seconds on a loaded machine: wait for it,
        never assume it.
        """
        store = create_store(self.direct_url)
        await store.open()
        try:
            async with asyncio.timeout(timeout):
                while True:
                    alive = {p.pid for p in self.procs if p.poll() is None}
                    if not alive:
                        raise RuntimeError("no worker is running: see their logs")
                    registered = {w.pid for w in await store.workers() if w.stopped_at is None}
                    if alive <= registered:
                        return
                    await asyncio.sleep(0.05)
        finally:
            await store.close()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def freeze_between_writes(proc: subprocess.Popen[bytes], url: str, job_id: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no lock that a write of ``job_id`` needs.

    A worker stopped inside one of its own transactions (a heartbeat, a rescue pass: with
    the tests' short lease and intervals, one runs every few hundred milliseconds) keeps
    its locks while stopped: SQLite's write lock, or PostgreSQL's lock on the job's row.
    Whoever writes next (a cancel, another worker's rescue) would then wait for a process
    that never goes on, which is not what the tests that freeze a worker are about. So:
    stop it, look, and if it holds one, let it go on a moment and stop it again.
    """
    for _ in range(100):
        proc.send_signal(signal.SIGSTOP)
        if _nothing_held(url, job_id):
            return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.03)
    raise AssertionError("the worker held a write lock at every one of 100 stops")


def _nothing_held(url: str, job_id: str) -> bool:
    """Whether a writer could take the job at once: SQLite's write lock is free, or
    PostgreSQL's lock on the job's row is."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as pg:  # the row lock, if taken, ends with the transaction
        try:
            pg.execute("SELECT 1 FROM conveyor_jobs WHERE id = %s FOR UPDATE NOWAIT", [job_id])
            return True
        except psycopg.errors.LockNotAvailable:
            return False
