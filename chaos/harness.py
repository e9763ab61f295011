"""One scenario's run: its database, its worker processes, the faults it injected.

Workers are real ``python -m conveyor worker chaos.app:app`` processes. Readiness is
observed, never assumed: a worker is ready once its row is in ``conveyor_workers``, a run
has started once its ``start`` record is in the run log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from chaos import runlog
from chaos.infra import PrivatePostgres, ReplicatedPostgres
from chaos.netproxy import ProxyProcess
from conveyor import Conveyor, Submission

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class WorkerOptions:
    """``conveyor worker`` flags; the chaos default is a short lease and a fast rescue."""

    lease: float = 2.0
    rescue_interval: float = 0.2
    poll_interval: float = 0.2
    concurrency: int = 4
    grace: float = 2.0
    cancel_grace: float = 1.0
    defaults: bool = False  # True: no timing flag at all (the CLI's defaults)

    def args(self) -> list[str]:
        if self.defaults:
            return ["--concurrency", str(self.concurrency)]
        return [
            "--lease", str(self.lease),
            "--rescue-interval", str(self.rescue_interval),
            "--poll-interval", str(self.poll_interval),
            "--concurrency", str(self.concurrency),
            "--grace", str(self.grace),
            "--cancel-grace", str(self.cancel_grace),
        ]  # fmt: skip

    @property
    def lease_seconds(self) -> float:
        return 30.0 if self.defaults else self.lease

    @property
    def rescue_seconds(self) -> float:
        return 5.0 if self.defaults else self.rescue_interval

    @property
    def poll_seconds(self) -> float:
        return 1.0 if self.defaults else self.poll_interval


@dataclass
class Fault:
    kind: str  # kill, stop, cont, term, lock, pg-stop, pg-start, disk-full, disk-free, ...
    mono: float
    pid: int = 0
    detail: str = ""
    wall: float = 0.0  # the machine's wall clock, to compare with times in the database


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    by_us: bool = False  # stopped by the harness (kill or SIGTERM): its exit is expected

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Run:
    """Everything one scenario on one backend did, for the checker and the report."""

    scenario: str
    backend: str
    url: str
    tmp: Path
    full: bool
    seed: int
    options: WorkerOptions = field(default_factory=WorkerOptions)
    pg: PrivatePostgres | None = None
    replica: ReplicatedPostgres | None = None  # the failover scenario's primary and standby
    faults: list[Fault] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    expected: dict[str, str] = field(default_factory=dict)  # job id -> terminal status
    violations: list[str] = field(default_factory=list)  # found by the scenario itself
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)  # job type -> global limit
    key_limits: dict[str, int] = field(default_factory=dict)  # job type -> per-key limit
    crash_exits: int = 0
    # Check that every run began with time left on the lease its claim stored (only
    # where nothing legitimately delays a handler's start past a lease: no blocked loop).
    check_lease_at_start: bool = False
    db_clock_offset: float = 0.0  # SQLite under faketime: the database's times are shifted
    app: Conveyor | None = None
    proxies: list[ProxyProcess] = field(default_factory=list)  # closed with the run
    _supervisor: asyncio.Task[None] | None = None

    # -- paths and environment ----------------------------------------------------------

    @property
    def runlog_dir(self) -> Path:
        path = self.tmp / "runlog"
        path.mkdir(exist_ok=True)
        return path

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                runlog.ENV: str(self.runlog_dir),
                "CONVEYOR_DATABASE_URL": self.url,
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
                "PYTHONUNBUFFERED": "1",
                "CHAOS_LIMITS": "1" if self.limits or self.key_limits else "0",
            }
        )
        env.update(extra or {})
        return env

    def fault(self, kind: str, pid: int = 0, detail: str = "") -> Fault:
        f = Fault(kind, time.monotonic(), pid, detail, time.time())
        self.faults.append(f)
        return f

    def records(self) -> list[runlog.Record]:
        return runlog.read(self.runlog_dir)

    # -- the client -------------------------------------------------------------------

    async def client(self) -> Conveyor:
        if self.app is None:
            from chaos.app import app

            app.use_database(self.url)
            self.app = app
        return self.app

    async def close(self) -> None:
        await self.stop_supervising()
        for w in self.workers:
            if w.alive():
                try:
                    w.proc.send_signal(signal.SIGCONT)
                    w.proc.kill()
                except ProcessLookupError:
                    pass
                w.proc.wait(10)
        for proxy in self.proxies:
            await proxy.close()
        self.proxies.clear()
        if self.app is not None:
            try:
                await asyncio.wait_for(self.app.close(), 30)
            except Exception as exc:
                self.notes.append(f"closing the client: {type(exc).__name__}: {exc}")
            self.app = None

    async def submit(
        self,
        type: str,
        payloads: Iterable[Mapping[str, Any]],
        *,
        expect: str = "succeeded",
        chunk: int = 500,
        **options: Any,
    ) -> list[str]:
        """Submit jobs in chunks; each must end in ``expect``."""
        app = await self.client()
        subs = [Submission(type, dict(p), **options) for p in payloads]
        ids: list[str] = []
        for i in range(0, len(subs), chunk):
            handles = await app.submit_many(subs[i : i + chunk])
            ids.extend(h.id for h in handles)
        for job_id in ids:
            self.expected[job_id] = expect
        return ids

    # -- direct database reads (not through conveyor) -----------------------------------

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        if self.backend == "sqlite":
            path = self.url.removeprefix("sqlite:///")
            lite = sqlite3.connect(path, timeout=60)
            lite.row_factory = sqlite3.Row
            try:
                return [dict(r) for r in lite.execute(query, params).fetchall()]
            finally:
                lite.close()
        query = query.replace("?", "%s")
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(query, params)
            cols = [c.name for c in cur.description or ()]
            return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    async def asql(self, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.sql, query, params)

    async def asql_retrying(self, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """As asql, riding out a database that is down or locked for a while."""
        deadline = time.monotonic() + 120
        while True:
            try:
                return await self.asql(query, params)
            except (sqlite3.Error, psycopg.Error):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    def lost_attempts(self) -> dict[tuple[str, int], float]:
        """(job id, attempt number) -> when the rescuer recorded it lost (epoch seconds)."""
        rows = self.sql(
            "SELECT job_id, number, finished_at FROM conveyor_attempts WHERE outcome = 'lost'"
        )
        out = {}
        for row in rows:
            at = row["finished_at"]
            out[(row["job_id"], int(row["number"]))] = (
                at.timestamp() if hasattr(at, "timestamp") else float(at)
            )
        return out

    def jobs(self) -> dict[str, dict[str, Any]]:
        rows = self.sql(
            "SELECT id, type, status, attempt, lease_token, state, result, concurrency_key "
            "FROM conveyor_jobs"
        )
        out = {}
        for row in rows:
            for key in ("state", "result"):
                value = row[key]
                if isinstance(value, str):
                    try:
                        row[key] = json.loads(value)
                    except ValueError:
                        pass
            out[row["id"]] = row
        return out

    # -- workers ------------------------------------------------------------------------

    async def start_worker(
        self,
        *,
        env: Mapping[str, str] | None = None,
        options: WorkerOptions | None = None,
        ready: bool = True,
        url: str | None = None,
    ) -> Worker:
        """Start a worker on the run's database (``url``: another way to it, a proxy's)."""
        opts = options or self.options
        index = len(self.workers)
        log = self.tmp / f"worker-{index}.log"
        command = [
            sys.executable, "-m", "conveyor", "--log-level", "INFO", "worker", "chaos.app:app",
            "--database-url", url or self.url, *opts.args(),
        ]  # fmt: skip
        with open(log, "wb") as out:
            extra = {**(env or {}), **({"CONVEYOR_DATABASE_URL": url} if url else {})}
            proc = subprocess.Popen(
                command, cwd=ROOT, env=self.env(extra), stdout=out, stderr=subprocess.STDOUT
            )
        worker = Worker(index, proc, log)
        self.workers.append(worker)
        if ready:
            await self.wait_ready(worker)
        return worker

    async def wait_ready(self, worker: Worker, timeout: float = 120) -> None:
        """Wait until the worker has registered itself in the database."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not worker.alive():
                raise RuntimeError(
                    f"worker {worker.pid} exited with {worker.proc.returncode} before it was "
                    f"ready:\n{worker.log.read_text(errors='replace')[-3000:]}"
                )
            try:
                rows = await self.asql(
                    "SELECT id FROM conveyor_workers WHERE pid = ? AND stopped_at IS NULL",
                    (worker.pid,),
                )
            except (sqlite3.Error, psycopg.Error):
                rows = []
            if rows:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"worker {worker.pid} not registered within {timeout}s")

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive()]

    def kill(self, worker: Worker) -> Fault:
        worker.by_us = True
        fault = self.fault("kill", worker.pid)
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(30)
        return fault

    def freeze(self, worker: Worker) -> None:
        self.fault("stop", worker.pid)
        worker.proc.send_signal(signal.SIGSTOP)

    def thaw(self, worker: Worker) -> None:
        worker.proc.send_signal(signal.SIGCONT)
        self.fault("cont", worker.pid)

    def terminate(self, worker: Worker) -> None:
        worker.by_us = True
        self.fault("term", worker.pid)
        worker.proc.send_signal(signal.SIGTERM)

    async def wait_exit(self, worker: Worker, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while worker.alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {worker.pid} still running after {timeout}s")
            await asyncio.sleep(0.05)
        return int(worker.proc.returncode)

    def supervise(self, keep: int, env: Mapping[str, str] | None = None) -> None:
        """Restart workers that exit on their own (as a process manager would)."""

        async def loop() -> None:
            while True:
                for w in list(self.workers):
                    if not w.alive() and not w.by_us:
                        w.by_us = True  # counted once
                        self.crash_exits += 1
                        self.notes.append(
                            f"worker {w.pid} exited by itself with code {w.proc.returncode}"
                        )
                if len(self.alive()) < keep:
                    await self.start_worker(env=env, ready=False)
                await asyncio.sleep(0.2)

        self._supervisor = asyncio.create_task(loop())

    async def stop_supervising(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            try:
                await self._supervisor
            except (asyncio.CancelledError, Exception):
                pass
            self._supervisor = None

    # -- waiting ------------------------------------------------------------------------

    async def wait_for(
        self, predicate: Callable[[], bool | Awaitable[bool]], timeout: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = predicate()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{what} not within {timeout}s")

    def running_on(self, worker: Worker) -> set[str]:
        """Jobs whose run on this worker has started and not ended, from the run log."""
        live: dict[str, bool] = {}
        for r in self.records():
            if r.pid != worker.pid or not r.job:
                continue
            if r.event == "start":
                live[r.job] = True
            elif r.event in ("end", "refused", "cancelled"):
                live[r.job] = False
        return {j for j, on in live.items() if on}

    async def wait_running(self, worker: Worker, timeout: float = 60) -> set[str]:
        found: set[str] = set()

        def check() -> bool:
            found.update(self.running_on(worker))
            return bool(found)

        await self.wait_for(check, timeout, f"a run on worker {worker.pid}")
        return found

    async def wait_terminal(self, timeout: float) -> bool:
        """Wait until every expected job is terminal; False on timeout (the checker reports)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                rows = await self.asql("SELECT id, status FROM conveyor_jobs")
            except (sqlite3.Error, psycopg.Error):
                await asyncio.sleep(0.5)
                continue
            status = {r["id"]: r["status"] for r in rows}
            if all(status.get(j) in TERMINAL for j in self.expected):
                return True
            await asyncio.sleep(0.25)
        return False

    # -- held locks ---------------------------------------------------------------------

    async def hold_write_lock(self, seconds: float) -> None:
        """Hold the database's write lock (SQLite) or an EXCLUSIVE lock on the jobs table
        (PostgreSQL) from another connection for ``seconds``."""
        taken = threading.Event()

        def hold() -> None:
            if self.backend == "sqlite":
                lite = sqlite3.connect(
                    self.url.removeprefix("sqlite:///"), timeout=60, isolation_level=None
                )
                try:
                    lite.execute("BEGIN IMMEDIATE")
                    taken.set()
                    time.sleep(seconds)
                    lite.execute("COMMIT")
                finally:
                    lite.close()
            else:
                with psycopg.connect(self.url) as conn:
                    conn.execute("LOCK TABLE conveyor_jobs IN EXCLUSIVE MODE")
                    taken.set()
                    time.sleep(seconds)
                    conn.commit()

        thread = asyncio.create_task(asyncio.to_thread(hold))
        while not taken.is_set():
            if thread.done():
                await thread
            await asyncio.sleep(0.01)
        self.fault("lock", detail=f"{seconds:g}s")
        await thread
        self.fault("unlock")
